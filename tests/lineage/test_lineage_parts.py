"""History.stage / commit_staged: a version made of parts staged by several writers."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from vlcc_adjoint.lineage import CorruptCheckpointError, History, StorageError
from vlcc_adjoint.state import flatten


def _spec(arrays):
    return flatten({f"a{i}": a for i, a in enumerate(arrays)})[1]


def test_parts_staged_by_two_writers_commit_as_one_version(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 700))  # several chunks
    b = np.full((), 2.5, np.float32)  # 0-d
    c = rng.integers(0, 9, 13).astype(np.int16)
    with History(tmp_path / "h") as w1, History(tmp_path / "h") as w2:
        e1 = w1.stage([a])
        e2 = w2.stage([b, c])
        assert len(w1.log()) == 0  # staged chunks are no version
        vid = w1.commit_staged(_spec([a, b, c]), e1 + e2, "parts", {"step": 4})
        assert [v.id for v in w2.log()] == [vid]
        state = w2.load(vid)
        assert np.array_equal(state["a0"], a) and state["a1"].shape == () and state["a1"] == 2.5
        assert np.array_equal(state["a2"], c) and state["a2"].dtype == np.int16
        assert np.array_equal(w2.read_leaf("main", 2), c) and w2.leaf_count(vid) == 3
        assert w2.version(vid).meta == {"step": 4}
        # A range of rows reads only the chunks that hold it.
        for lo, hi in ((0, 300), (100, 151), (299, 300), (7, 7)):
            assert np.array_equal(w2.read_leaf(vid, 0, rows=(lo, hi)), a[lo:hi])
        with pytest.raises(IndexError):
            w2.read_leaf(vid, 0, rows=(10, 301))
        with pytest.raises(IndexError):
            w2.read_leaf(vid, 1, rows=(0, 1))  # 0-d
        # Unchanged chunks are not written again.
        again = w2.stage([a])
        assert again[0]["chunks"] == e1[0]["chunks"] and again[0]["written"] == 0


def test_commit_staged_refuses_bad_entries_and_missing_chunks(tmp_path):
    x = np.arange(1000.0)
    with History(tmp_path / "h") as h:
        (e,) = h.stage([x])
        bad = dict(e, chunks=e["chunks"] + e["chunks"])
        with pytest.raises(ValueError, match="chunk grid"):
            h.commit_staged(_spec([x]), [bad])
        with pytest.raises(ValueError, match="one leaf per"):
            h.commit_staged(_spec([x, x]), [e])
        for f in glob.glob(os.path.join(h.path, "chunks", "*", "*")):
            os.unlink(f)  # as a gc between staging and commit would
        with pytest.raises(StorageError, match="missing"):
            h.commit_staged(_spec([x]), [e])
        assert len(h.log(all=True)) == 0
        assert os.listdir(os.path.join(h.path, "scratch")) == ["zarr.json"]


def test_read_leaf_verifies_the_chunks(tmp_path):
    with History(tmp_path / "h") as h:
        vid = h.commit({"x": np.arange(100.0)})
        h.wait()
        (chunk,) = glob.glob(os.path.join(h.path, "chunks", "*", "*"))
        os.chmod(chunk, 0o644)
        with open(chunk, "r+b") as f:
            f.write(b"\x01")
        with pytest.raises(CorruptCheckpointError) as info:
            h.read_leaf(vid, 0)
        assert info.value.path is not None
        with pytest.raises(IndexError):
            h.read_leaf(vid, 1)


def test_read_leaf_rows_reads_only_the_chunks_holding_them(tmp_path):
    a = np.arange(300 * 700, dtype=np.float64).reshape(300, 700)  # two 1 MiB row bands
    with History(tmp_path / "h") as h:
        vid = h.commit({"a": a})
        h.wait()
        vdir = os.path.join(h.path, "versions", vid, "0")
        last = sorted(f for f in os.listdir(vdir) if f.startswith("c"))[-1]
        with open(os.path.join(vdir, last), "r+b") as f:  # damage the second band only
            f.write(b"\x07")
        assert np.array_equal(h.read_leaf(vid, 0, rows=(0, 10)), a[:10])
        with pytest.raises(CorruptCheckpointError):
            h.read_leaf(vid, 0, rows=(290, 300))


def test_plain_zarr_reads_a_version_made_of_staged_parts(tmp_path):
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 700))  # several chunks, an edge chunk
    b = np.arange(7, dtype=">i4")
    c = np.array(["2020-01-02", "2021-03-04"], "M8[D]")  # no zarr type: raw bytes
    with History(tmp_path / "h") as w1, History(tmp_path / "h") as w2:
        vid = w1.commit_staged(_spec([a, b, c]), w1.stage([a]) + w2.stage([b, c]))
    group = zarr.open_group(str(tmp_path / "h"), mode="r")[f"versions/{vid}"]
    np.testing.assert_array_equal(group["0"][...], a)
    np.testing.assert_array_equal(group["1"][...], b)
    raw = np.ascontiguousarray(group["2"][...])  # uint8, with a trailing axis of itemsize
    assert raw.dtype == np.uint8 and raw.shape == (2, 8)
    np.testing.assert_array_equal(raw.view(c.dtype).reshape(c.shape), c)
