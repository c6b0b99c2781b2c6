"""Delta chunks in the lineage History (``History(path, deltas=True)``)."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from vlcc_adjoint._lineage import _delta as D
from vlcc_adjoint.lineage import CorruptCheckpointError, History, import_history

N = 8 << 20  # state bytes
CHUNK = 256 << 10  # chunk bytes; regions are 1/16 of a chunk, as 64 KiB in 1 MiB
REGION = 16 << 10


def _series(rng, versions=20, frac=0.05):
    """States of `versions` commits, each rewriting `frac` of the bytes in unaligned regions."""
    x = rng.integers(0, 256, N, dtype=np.uint8)
    out = [x.copy()]
    for _ in range(versions - 1):
        for _ in range(int(frac * N) // REGION):
            off = int(rng.integers(0, N - REGION))
            x[off : off + REGION] = rng.integers(0, 256, REGION, dtype=np.uint8)
        out.append(x.copy())
    return out


def _commit_all(path, states, **kw):
    with History(path, chunk_bytes=CHUNK, **kw) as h:
        ids = [h.commit({"x": s}, f"v{k}") for k, s in enumerate(states)]
        h.wait()
        return ids, h.usage()


def _files(path):
    """(full chunk files, delta files) of a repository."""
    full, delta = [], []
    for f in glob.glob(os.path.join(path, "chunks", "??", "*")):
        with open(f, "rb") as fh:
            (delta if fh.read(8) == D.MAGIC else full).append(f)
    return full, delta


def test_unaligned_five_percent_costs_the_minimum(tmp_path):
    states = _series(np.random.default_rng(0))
    minimum = N * (1 + 19 * 0.05)
    ids, usage = _commit_all(str(tmp_path / "d"), states, deltas=True)
    assert usage.chunk_bytes <= 1.05 * minimum, usage.chunk_bytes / minimum
    # the same series without deltas stores every touched chunk again
    _, plain = _commit_all(str(tmp_path / "p"), states)
    assert plain.chunk_bytes > 2 * minimum
    with History(str(tmp_path / "d")) as h:  # a fresh process's view: nothing cached
        for vid, s in zip(ids, states):
            assert h.checkout(vid)["x"].tobytes() == s.tobytes()


def _two_versions(path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4 * CHUNK // 4).astype(np.float32)
    y = x.copy()
    y[1000:1100] += 1.0  # changes chunk 0 a little: a delta against v0's chunk 0
    ids, _ = _commit_all(path, [x, y], deltas=True)
    return ids, x, y


def test_flipped_byte_in_delta_or_base_names_the_file(tmp_path):
    path = str(tmp_path / "h")
    ids, x, y = _two_versions(path)
    full, delta = _files(path)
    assert len(delta) == 1 and len(full) == 4
    with History(path) as h:
        assert np.array_equal(h.checkout(ids[1])["x"], y)
        base = D.base_of(
            h._chunks, os.path.basename(os.path.dirname(delta[0])) + os.path.basename(delta[0])
        )
    base_file = os.path.join(path, "chunks", base[:2], base[2:])
    assert base_file in full
    for victim, where in ((delta[0], 40), (delta[0], -3), (base_file, 77)):
        with open(victim, "r+b") as f:
            f.seek(where, os.SEEK_END if where < 0 else os.SEEK_SET)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x10]))
        with History(path) as h, pytest.raises(CorruptCheckpointError) as err:
            h.checkout(ids[1])
        assert err.value.path == victim and victim in str(err.value)
        with open(victim, "r+b") as f:  # repair
            f.seek(where, os.SEEK_END if where < 0 else os.SEEK_SET)
            f.seek(-0, os.SEEK_CUR)
            f.write(b)
        with History(path) as h:
            assert np.array_equal(h.checkout(ids[1])["x"], y)


def test_gc_keeps_the_bases_of_kept_versions(tmp_path):
    path = str(tmp_path / "h")
    ids, x, y = _two_versions(path)
    with History(path) as h:
        report = h.gc(keep=1)
        assert report.removed == (ids[0],)
        assert [v.id for v in h.log()] == [ids[1]]
    with History(path) as h:
        assert np.array_equal(h.checkout(ids[1])["x"], y)
    assert len(_files(path)[0]) == 4  # v0's chunk 0 is still there: v1's delta needs it


def test_gc_by_a_process_opened_before_deltas_keeps_bases(tmp_path):
    path = str(tmp_path / "h")
    with History(path, chunk_bytes=CHUNK) as old:
        old.wait()
        ids, x, y = _two_versions(path)
        old.gc(keep=1)
    with History(path) as h:
        assert np.array_equal(h.checkout(ids[1])["x"], y)


def test_export_import_carries_bases(tmp_path):
    path = str(tmp_path / "h")
    ids, x, y = _two_versions(path)
    with History(path) as h:
        h.gc(keep=1)
        h.export(str(tmp_path / "a.tar"))
    import_history(str(tmp_path / "a.tar"), str(tmp_path / "copy"))
    with History(str(tmp_path / "copy")) as h:
        assert np.array_equal(h.checkout(ids[1])["x"], y)


def test_chains_stay_bounded(tmp_path):
    path = str(tmp_path / "h")
    x = np.random.default_rng(2).integers(0, 256, CHUNK, dtype=np.uint8)
    states = []
    for k in range(2 * D.MAX_DEPTH + 5):
        x[k * 64 : k * 64 + 64] ^= 0xFF  # a small change of the one chunk every version
        states.append(x.copy())
    ids, _ = _commit_all(path, states, deltas=True)
    full, delta = _files(path)
    depths = []
    for f in delta:
        with open(f, "rb") as fh:
            depths.append(D.parse(fh.read(), CHUNK)[1])
    assert max(depths) == D.MAX_DEPTH  # chains grow to the bound, never past it
    assert len(full) >= 2  # and were rebased onto a full chunk
    with History(path) as h:
        for vid, s in zip(ids, states):
            assert h.checkout(vid)["x"].tobytes() == s.tobytes()


def test_without_deltas_nothing_changes(tmp_path):
    path = str(tmp_path / "h")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(CHUNK // 2).astype(np.float32)
    y = x.copy()
    y[5] = 7.0
    ids, _ = _commit_all(path, [x, y])
    full, delta = _files(path)
    assert not delta and len(full) == 3  # two chunks, one changed
    with open(os.path.join(path, "zarr.json")) as f:
        assert "deltas" not in json.load(f)["attributes"]["vlcc_lineage"]
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(path, mode="r")
    assert np.array_equal(root[f"versions/{ids[1]}/0"][...], y)  # plain zarr reads it


def test_the_setting_is_recorded_in_the_repository(tmp_path):
    path = str(tmp_path / "h")
    with History(path, deltas=True):
        pass
    with open(os.path.join(path, "zarr.json")) as f:
        assert json.load(f)["attributes"]["vlcc_lineage"]["deltas"] is True
    with History(path) as h:  # another process opening it plainly writes deltas too
        assert h.deltas
        x = np.arange(CHUNK // 4, dtype=np.float32)
        h.commit({"x": x})
        x[3] = -1
        vid = h.commit({"x": x})
        h.wait()
    assert len(_files(path)[1]) == 1
    with pytest.raises(ValueError, match="deltas=True"):
        History(path, deltas=False)
    with History(path, mode="r") as h:
        assert np.array_equal(h.checkout(vid)["x"], x)


def test_full_training_step_roundtrips(tmp_path):
    """Every weight changes a little: whatever is stored, checkouts are bit-identical."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal(N // 4).astype(np.float32)
    states = [w.copy()]
    for _ in range(3):
        w -= np.float32(1e-4) * rng.standard_normal(w.size).astype(np.float32)
        states.append(w.copy())
    ids, _ = _commit_all(str(tmp_path / "h"), states, deltas=True)
    with History(str(tmp_path / "h")) as h:
        for vid, s in zip(ids, states):
            assert h.checkout(vid)["x"].tobytes() == s.tobytes()


def test_crafted_chains_are_refused(tmp_path):
    """A well-formed delta that resolves to other bytes, names itself as its base, or
    claims a wrong depth is damage, blamed on its file."""
    path = str(tmp_path / "h")
    ids, x, y = _two_versions(path)
    delta = _files(path)[1][0]
    addr = os.path.basename(os.path.dirname(delta)) + os.path.basename(delta)
    with open(delta, "rb") as f:
        blob = f.read()
    base, depth, chain, payload = D.parse(blob, CHUNK)
    for new_base, new_depth in ((base, 1), (addr, 1), (base, 2), (base, D.READ_DEPTH + 1)):
        crafted = D.encode(
            np.zeros(CHUNK, np.uint8), np.zeros(CHUNK, np.uint8), new_base, new_depth - 1, 0, 4
        )
        os.unlink(delta)  # a new inode: the version's hard link keeps the original
        with open(delta, "wb") as f:
            f.write(crafted)
        with History(path) as h, pytest.raises(CorruptCheckpointError) as err:
            h.checkout(ids[1])
        assert err.value.path == delta


@pytest.mark.parametrize("kw", [{"codec": "lz4"}, {"capture": "copy"}])
def test_deltas_with_a_codec_or_copy_capture(tmp_path, kw):
    from vlcc_adjoint.storage.codecs import Lossless

    kw = {"codec": Lossless()} if "codec" in kw else kw
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, 4 * CHUNK, dtype=np.uint8)
    states = [x.copy()]
    for k in range(4):
        x[k * 1000 + 10 : k * 1000 + 900] = rng.integers(0, 256, 890, dtype=np.uint8)
        states.append(x.copy())
    ids, _ = _commit_all(str(tmp_path / "h"), states, deltas=True, **kw)
    assert len(_files(str(tmp_path / "h"))[1]) == 4
    with History(str(tmp_path / "h")) as h:
        for vid, s in zip(ids, states):
            assert h.checkout(vid)["x"].tobytes() == s.tobytes()
        d = h.diff(ids[0], ids[-1])
    assert "changed" in str(d)


def test_a_reader_opened_before_deltas_were_turned_on(tmp_path):
    path = str(tmp_path / "h")
    x = np.random.default_rng(6).integers(0, 256, 2 * CHUNK, dtype=np.uint8)
    with History(path, chunk_bytes=CHUNK) as old:
        old.commit({"x": x})
        old.wait()
        with History(path, chunk_bytes=CHUNK, deltas=True) as h:
            x[100:200] = 7
            vid = h.commit({"x": x})
        assert len(_files(path)[1]) == 1
        assert old.checkout(vid)["x"].tobytes() == x.tobytes()
        x[300:400] = 9
        vid = old.commit({"x": x}, branch="main")  # and it writes deltas from now on
    assert len(_files(path)[1]) == 2
    with History(path) as h:
        assert h.checkout(vid)["x"].tobytes() == x.tobytes()
