"""``History.verify()`` and ``vlcc verify``: one flipped byte in any file a read depends
on is found and named with the versions it breaks; export and import refuse damage;
``vlcc export`` replaces an archive only with ``--force``."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

from vlcc_adjoint._lineage import _format as F
from vlcc_adjoint.cli import main as vlcc
from vlcc_adjoint.lineage import (
    CorruptCheckpointError,
    History,
    StorageError,
    Verification,
    export_history,
    import_history,
)

N = 64  # float64 per chunk at chunk_bytes=512


def flip(path, at: int | None = None) -> None:
    """XOR one byte of the file `path` (the middle one by default) with 1."""
    data = bytearray(open(path, "rb").read())
    i = len(data) // 2 if at is None else at
    data[i] ^= 1
    with open(path, "r+b") as f:  # in place: the inode (and its hard links) stay
        f.write(bytes(data))


def make(path, deltas=False):
    """Three versions of 4 chunks: v0; v1 changes chunk 3; v2 changes chunk 0."""
    ids = []
    a = np.arange(4 * N, dtype=np.float64)
    with History(path, chunk_bytes=8 * N, deltas=deltas) as h:
        for k in range(3):
            if k == 1:
                a[3 * N + 5] += 1.0
            if k == 2:
                a[5] += 1.0
            ids.append(h.commit({"a": a.copy(), "k": k}, f"v{k}"))
        h.wait()
        manifests = {vid: h._reader.manifest(vid) for vid in ids}  # test's view of the files
    return ids, manifests


def chunk_file(repo, manifest, j):
    return os.path.join(repo, F.chunk_relpath(manifest.leaves[0][2][j]))


def verify(repo) -> Verification:
    with History(repo, mode="r") as h:
        return h.verify()


def test_a_clean_history_verifies_with_a_one_line_summary(tmp_path, capsys):
    repo = str(tmp_path / "h")
    make(repo)
    report = verify(repo)
    assert report.ok and report and report.versions == 3 and report.chunks == 6
    assert vlcc(["verify", repo]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.strip().splitlines() == [report.summary()]
    assert out.startswith(f"verified {repo}: 3 versions, 6 chunk files") and "no damage" in out


def test_a_flipped_byte_in_a_shared_chunk_names_it_and_every_version_using_it(tmp_path, capsys):
    repo = str(tmp_path / "h")
    ids, ms = make(repo)
    shared = chunk_file(repo, ms[ids[0]], 1)  # chunk 1 never changes: all three use it
    only_v0 = chunk_file(repo, ms[ids[0]], 0)  # v0 and v1 (v2 changed chunk 0)
    flip(shared)
    flip(only_v0)
    report = verify(repo)
    assert not report.ok
    by_path = {d.path: d.versions for d in report.damaged}
    assert by_path == {shared: tuple(sorted(ids)), only_v0: tuple(sorted(ids[:2]))}
    assert "checksum" in report.damaged[0].problem
    assert vlcc(["verify", repo]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 3 and err == ""
    assert all(line.startswith("damaged: ") for line in lines[:2])
    assert any(shared in line and "breaks 3 versions" in line for line in lines)
    assert "2 damaged files break 3 of 3 versions" in lines[-1]


def test_a_flipped_byte_in_a_manifest_breaks_that_version_only(tmp_path):
    repo = str(tmp_path / "h")
    ids, _ = make(repo)
    manifest = os.path.join(repo, F.VERSIONS, ids[1], "zarr.json")
    flip(manifest)
    report = verify(repo)
    assert [(d.path, d.versions) for d in report.damaged] == [(manifest, (ids[1],))]


@pytest.mark.parametrize("which", ["graph", "root"])
def test_a_flipped_byte_in_the_graph_or_the_root_breaks_every_version(tmp_path, capsys, which):
    repo = str(tmp_path / "h")
    make(repo)
    path = os.path.join(repo, F.GRAPH, "zarr.json") if which == "graph" else f"{repo}/zarr.json"
    with History(repo, mode="r") as h:  # opened intact, damaged since
        flip(path)
        report = h.verify()
    assert [(d.path, d.versions) for d in report.damaged] == [(path, ("*",))]
    assert "every version" in report.summary()
    # The command cannot open it at all: it says so, and which file.
    assert vlcc(["verify", repo]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"damaged: {path}: breaks every version")
    assert "Traceback" not in out + err


def test_a_flipped_byte_in_a_leaf_array_that_plain_zarr_reads_is_named(tmp_path):
    repo = str(tmp_path / "h")
    ids, _ = make(repo)
    meta = os.path.join(repo, F.VERSIONS, ids[2], "0", "zarr.json")
    flip(meta)
    report = verify(repo)
    assert [(d.path, d.versions) for d in report.damaged] == [(meta, (ids[2],))]
    with History(repo, mode="r") as h:
        h.load(ids[2])  # History itself does not read it: only plain zarr would


def test_a_chunk_copied_into_a_version_and_then_damaged_is_named(tmp_path):
    """Where the file system refused hard links the version holds copies,
    which plain zarr reads: they must equal the chunk files."""
    repo = str(tmp_path / "h")
    ids, ms = make(repo)
    linked = os.path.join(repo, F.VERSIONS, ids[0], "0", "c.0")
    assert os.path.exists(linked)
    data = open(linked, "rb").read()
    os.unlink(linked)
    with open(linked, "wb") as f:
        f.write(data)
    assert verify(repo).ok  # an identical copy is fine
    flip(linked)
    report = verify(repo)
    assert [(d.path, d.versions) for d in report.damaged] == [(linked, (ids[0],))]


def test_a_missing_chunk_is_named(tmp_path):
    repo = str(tmp_path / "h")
    ids, ms = make(repo)
    gone = chunk_file(repo, ms[ids[2]], 0)  # only v2's
    os.unlink(gone)
    report = verify(repo)
    assert [(d.path, d.versions) for d in report.damaged] == [(gone, (ids[2],))]
    assert "missing" in report.damaged[0].problem


def test_delta_chunks_are_checked_with_their_bases(tmp_path):
    repo = str(tmp_path / "h")
    ids, ms = make(repo, deltas=True)
    base = chunk_file(repo, ms[ids[0]], 3)  # v0's chunk 3: the base of v1's
    delta = chunk_file(repo, ms[ids[1]], 3)
    assert open(delta, "rb").read(4) != open(base, "rb").read(4)  # a delta object
    flip(base)
    report = verify(repo)
    # v1 and v2 read chunk 3 through the base: all three are broken by it.
    assert [(d.path, d.versions) for d in report.damaged] == [(base, tuple(sorted(ids)))]
    flip(base)  # repaired
    assert verify(repo).ok
    flip(delta, at=os.path.getsize(delta) - 3)
    report = verify(repo)
    assert [(d.path, d.versions) for d in report.damaged] == [(delta, tuple(sorted(ids[1:])))]


def test_export_refuses_a_damaged_history_naming_the_file(tmp_path, capsys):
    repo = str(tmp_path / "h")
    ids, ms = make(repo)
    bad = chunk_file(repo, ms[ids[2]], 0)
    flip(bad)
    out = tmp_path / "a.tar"
    with pytest.raises(CorruptCheckpointError, match="1 damaged file") as info:
        export_history(repo, out)
    assert bad in str(info.value) and ids[2] in str(info.value)
    assert os.listdir(tmp_path) == ["h"]  # no archive, no partial file
    assert vlcc(["export", repo, str(out)]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and bad in err


def test_export_replaces_an_archive_only_with_force(tmp_path, capsys):
    repo = str(tmp_path / "h")
    make(repo)
    out = tmp_path / "a.tar"
    out.write_bytes(b"precious")
    with pytest.raises(StorageError, match="exists.*--force"):
        export_history(repo, out)
    assert out.read_bytes() == b"precious"
    assert vlcc(["export", repo, str(out)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("vlcc: error: ") and "--force" in err and out.read_bytes() == b"precious"
    assert vlcc(["export", repo, str(out), "--force"]) == 0
    assert tarfile.is_tarfile(out)
    assert sorted(os.listdir(tmp_path)) == ["a.tar", "h"]
    with pytest.raises(StorageError, match="directory"):
        export_history(repo, tmp_path, force=True)


def _damaged_archive(tmp_path, member_of):
    """An archive of a clean history with one byte flipped in the member
    `member_of(ids, manifests)` names (relative to the repository)."""
    repo = str(tmp_path / "h")
    ids, ms = make(repo)
    member = member_of(ids, ms)
    src = tmp_path / "a.tar"
    export_history(repo, src)
    bad = tmp_path / "bad.tar"
    with tarfile.open(src) as tin, tarfile.open(bad, "w") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None
            if m.name == member:
                data = bytearray(data)
                data[len(data) // 2] ^= 1
                data = bytes(data)
            tout.addfile(m, None if data is None else io.BytesIO(data))
    return bad, member, ids


@pytest.mark.parametrize("kind", ["chunk", "manifest"])
def test_import_refuses_an_archive_with_a_damaged_file_and_keeps_nothing(tmp_path, capsys, kind):
    def member_of(ids, ms):
        if kind == "chunk":
            return F.chunk_relpath(ms[ids[1]].leaves[0][2][1])
        return f"{F.VERSIONS}/{ids[1]}/zarr.json"

    bad, member, ids = _damaged_archive(tmp_path, member_of)
    dest = tmp_path / "new"
    with pytest.raises(CorruptCheckpointError, match="importing") as info:
        import_history(bad, dest)
    assert member in str(info.value) and ids[1] in str(info.value)
    assert not dest.exists()
    dest.mkdir()  # an empty directory given: it stays, empty
    assert vlcc(["import", str(bad), str(dest)]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and member in err
    assert dest.is_dir() and os.listdir(dest) == []


def test_import_of_a_clean_archive_verifies_and_keeps_it(tmp_path):
    bad, _, ids = _damaged_archive(tmp_path, lambda ids, ms: "no such member")
    dest = import_history(bad, tmp_path / "new")
    with History(dest, mode="r") as h:
        assert h.verify().ok and [v.id for v in h.log()] == ids[::-1]


def test_verify_of_something_else_is_a_one_line_error(tmp_path, capsys):
    for path in (tmp_path / "missing", tmp_path):
        assert vlcc(["verify", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
        assert err.startswith("vlcc: error: ") and "neither a lineage history" in err


def test_clean_histories_of_every_kind_verify(tmp_path):
    """Never crying wolf: compressed chunks, deltas, empty and 0-d leaves,
    versions after gc, an imported copy all verify clean."""
    from vlcc_adjoint.storage.codecs import Lossless

    x = np.random.default_rng(0).standard_normal(300)
    for k, options in enumerate([{}, {"codec": Lossless()}, {"codec": Lossless(), "deltas": True}]):
        repo = tmp_path / f"h{k}"
        with History(repo, chunk_bytes=256, **options) as h:
            for step in range(4):
                x[step * 40] += 1
                state = {"x": x.copy(), "e": np.empty(0), "z": np.float32(3), "s": np.zeros((2, 0))}
                h.commit(state, f"v{step}")
            h.gc(keep=2)
            report = h.verify()
            assert report.ok, str(report)
            assert report.versions == 2
        assert verify(
            import_history(export_history(repo, tmp_path / f"a{k}.tar"), tmp_path / f"c{k}")
        )


def test_every_flipped_metadata_byte_is_named_by_verify_or_harmless(tmp_path):
    """Verification agrees with reading: a flipped byte in any metadata file is
    either reported (naming that file) or changes nothing any read returns."""
    repo = tmp_path / "h"
    ids, _ = make(repo)
    with History(repo, mode="r") as h:
        states = {vid: h.load(vid) for vid in ids}
        log = [(v.id, v.message, v.parents) for v in h.log(all=True)]
    files = sorted(repo.rglob("zarr.json"))
    named = harmless = 0
    for path in files:
        original = path.read_bytes()
        for i in range(0, len(original), 23):
            damaged = bytearray(original)
            damaged[i] ^= 1
            path.write_bytes(bytes(damaged))
            try:
                report = verify(repo)
            except CorruptCheckpointError as err:  # the root or the graph: no opening
                assert err.path == str(path), (path, i, err)
                named += 1
                continue
            if report.ok:
                with History(repo, mode="r") as h:
                    assert [(v.id, v.message, v.parents) for v in h.log(all=True)] == log
                    for vid, state in states.items():
                        got = h.load(vid)
                        assert got["k"] == state["k"] and np.array_equal(got["a"], state["a"])
                harmless += 1
            else:
                assert [d.path for d in report.damaged] == [str(path)], (path, i, str(report))
                named += 1
        path.write_bytes(original)
    assert named > 100 and harmless > 0
