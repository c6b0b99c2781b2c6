"""The versioned lineage: vlcc_adjoint.lineage.History and the vlcc lineage commands."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlcc_adjoint._lineage import _format as F
from vlcc_adjoint.cli import main as vlcc
from vlcc_adjoint.lineage import (
    Comparison,
    CorruptCheckpointError,
    Diff,
    GCReport,
    History,
    KeepPolicy,
    StorageError,
    Version,
    import_history,
)
from vlcc_adjoint.storage import ZarrTier, make_record
from vlcc_adjoint.storage.codecs import ErrorBounded, Lossless

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class Params:
    c: np.ndarray
    rho: float


def assert_same(a, b):
    """Structural, bitwise equality of two states."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.dtype.str == b.dtype.str and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def rich_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((40, 30, 20))
    return {
        "u": rng.standard_normal((64, 48)),
        "view": big[:, ::2, 1],  # non-contiguous
        "be": np.arange(7, dtype=">i4"),
        "c": (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(np.complex64),
        "flags": rng.random(9) > 0.5,
        "when": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
        "names": np.array(["alpha", "be"]),
        "rec": np.array([(1, 2.5), (3, -1.0)], dtype=[("i", "<i2"), ("x", "<f8")]),
        "zero_d": np.array(3.25),
        "empty": np.zeros((0, 4), np.float32),
        "f16": np.linspace(0, 1, 11, dtype=np.float16),
        "scalars": [np.float32(1.5), 7, 2.5, float("nan"), "text", None, b"\x00\x01", 1 + 2j],
        "params": Params(c=np.ones(3), rho=1000.0),
        "nested": ({1: np.arange(3)}, (np.eye(2),)),
    }


def small(k: int, n: int = 1000) -> dict:
    return {"x": np.full(n, float(k)), "step": k}


# -- commit and checkout -------------------------------------------------------------------


@pytest.mark.parametrize("capture", ["hash", "copy"])
def test_checkout_restores_every_kind_of_leaf_bit_identically(tmp_path, capture):
    state = rich_state()
    with History(tmp_path / "h", capture=capture, chunk_bytes=4096) as h:
        vid = h.commit(state, message="rich", meta={"step": 3})
        assert F.VERSION_ID.fullmatch(vid)
        assert_same(h.checkout(vid), state)
    with History(tmp_path / "h", mode="r") as h:  # a new process's view
        assert_same(h.load(vid), state)


@pytest.mark.parametrize("capture", ["hash", "copy"])
def test_commit_owns_the_state_so_the_caller_may_overwrite_it_at_once(tmp_path, capture):
    u = np.arange(300_000, dtype=np.float64)
    with History(tmp_path / "h", capture=capture, chunk_bytes=64 << 10) as h:
        ids = []
        for k in range(4):
            u[k * 1000 : (k + 1) * 1000] = -k  # changes a few chunks per commit
            ids.append(h.commit({"u": u}, meta={"k": k}))
            u[:] = 12345.0  # trash the buffer before the background writer runs
            u[:] = np.arange(300_000, dtype=np.float64)
            for j in range(k + 1):
                u[j * 1000 : (j + 1) * 1000] = -j
        expect = np.arange(300_000, dtype=np.float64)
        for k, vid in enumerate(ids):
            expect[k * 1000 : (k + 1) * 1000] = -k
            assert np.array_equal(h.checkout(vid)["u"], expect)


def test_log_lists_versions_newest_first_with_their_metadata(tmp_path):
    with History(tmp_path / "h") as h:
        assert h.log() == [] and h.head == "main" and h.head_version is None
        t0 = time.time()
        ids = [
            h.commit(small(k), message=f"step {k}", meta={"step": k, "loss": 1 / (k + 1)})
            for k in range(4)
        ]
        log = h.log()
        assert [v.id for v in log] == ids[::-1]
        v = log[0]
        assert isinstance(v, Version)
        assert (v.message, v.meta, v.branch, v.parents) == (
            "step 3",
            {"step": 3, "loss": 0.25},
            "main",
            (ids[2],),
        )
        assert t0 - 1 <= v.created <= time.time() and v.time.year >= 2024
        assert log[-1].parents == ()
        assert v.nbytes == 8000 and log[-1].new_bytes >= 8000
        assert h.log(limit=2) == log[:2] and len(h) == 4
        assert h.version(ids[1]).meta["step"] == 1 and ids[1] in h


def test_branch_checkout_moves_head_and_commits_append_to_that_branch(tmp_path):
    with History(tmp_path / "h") as h:
        a = [h.commit(small(k)) for k in range(3)]
        assert h.branch("exp", at=a[0]) == a[0]
        state = h.checkout("exp")
        assert state["step"] == 0 and h.head == "exp" and h.head_version == a[0]
        b1 = h.commit(small(10))
        assert h.version(b1).parents == (a[0],) and h.version(b1).branch == "exp"
        assert h.branches == {"main": a[2], "exp": b1}
        assert [v.id for v in h.log("exp")] == [b1, a[0]]
        assert [v.id for v in h.log("main")] == a[::-1]
        assert {v.id for v in h.log(all=True)} == set(a) | {b1}
        with pytest.raises(ValueError, match="exists"):
            h.branch("exp", at=a[1])
        h.branch("exp2", at="exp")
        h.delete_branch("exp2")
        assert "exp2" not in h.branches
    with History(tmp_path / "h") as h:  # the branch last checked out is HEAD on reopening
        assert h.head == "exp" and h.head_version == b1
        assert h.commit(small(11)) and h.version("exp").parents == (b1,)


def test_checkout_of_a_version_detaches_head_and_commit_then_needs_a_branch(tmp_path):
    with History(tmp_path / "h") as h:
        a = [h.commit(small(k)) for k in range(3)]
        assert h.checkout()["step"] == 2 and h.head == "main"  # HEAD stays attached
        assert h.checkout(a[1])["step"] == 1
        assert h.head is None and h.head_version == a[1]
        with pytest.raises(ValueError, match="detached"):
            h.commit(small(5))
        fix = h.commit(small(5), branch="fix")
        assert h.version(fix).parents == (a[1],) and h.head == "fix"
        assert h.branches["main"] == a[2]


def test_refs_tags_prefixes_and_ancestry(tmp_path):
    with History(tmp_path / "h") as h:
        a = [h.commit(small(k)) for k in range(5)]
        assert h.resolve("main") == a[4] and h.resolve("HEAD~2") == a[2]
        assert h.resolve("main~") == a[3] and h.resolve(a[3][:6]) == a[3]
        assert h.tag("good", a[1]) == a[1] and h.resolve("good~1") == a[0]
        assert h.version("good").tags == ("good",) and h.tags == {"good": a[1]}
        with pytest.raises(ValueError, match="force=True"):
            h.tag("good", a[2])
        h.tag("good", a[2], force=True)
        h.delete_tag("good")
        assert h.tags == {}
        for bad in ("nope", "main~9", a[0][:2]):
            with pytest.raises(KeyError):
                h.resolve(bad)
        with pytest.raises(ValueError, match="invalid tag name"):
            h.tag("../x", a[0])
        assert [v.id for v in h.ancestors(a[3])] == a[2::-1]
        assert [v.id for v in h.descendants(a[1])] == a[:1:-1]


def test_merge_commit_has_both_parents_and_log_follows_both(tmp_path):
    with History(tmp_path / "h") as h:
        root = h.commit(small(0))
        h.branch("side", at=root)
        m1 = h.commit(small(1))
        h.checkout("side")
        s1 = h.commit(small(2))
        h.checkout("main")
        merged = h.commit(small(3), message="merge side", merge=["side"])
        assert h.version(merged).parents == (m1, s1)
        assert {v.id for v in h.log()} == {merged, m1, s1, root}
        drawing = h.draw()
        assert "|\\" in drawing and "|/" in drawing and "HEAD -> main" in drawing


# -- diff and compare -----------------------------------------------------------------------


def test_diff_reports_changed_leaves_values_and_structure(tmp_path):
    with History(tmp_path / "h", chunk_bytes=1024) as h:
        s = {"u": np.linspace(0.0, 1.0, 1000), "w": np.ones(50), "t": 0.5, "name": "a"}
        a = h.commit(s)
        s["u"] = s["u"].copy()
        s["u"][700] += 0.25
        s["u"][10] = np.nan
        s["t"] = 0.75
        b = h.commit(s)
        d = h.diff(a, b)
        assert isinstance(d, Diff) and d.changed
        u = d["state['u']"]
        assert u.status == "changed" and u.n_changed == 2 and np.isinf(u.max_abs)
        assert d["state['w']"].status == "same" and d["state['w']"].max_abs == 0.0
        assert d.values == (("state['t']", 0.5, 0.75),)
        assert "state['u']" in d.table()
        assert not h.diff(a, a).changed
        s2 = {"u": np.zeros(3), "extra": np.ones(2), "t": 0.75, "name": "a"}
        d2 = h.diff(b, s2)  # a version against a live state
        assert d2["state['u']"].status == "reshaped"
        assert d2["state['w']"].status == "removed" and d2["state['extra']"].status == "added"


def test_diff_reads_only_the_chunks_that_differ(tmp_path, monkeypatch):
    with History(tmp_path / "h", chunk_bytes=8000) as h:
        u = np.random.default_rng(0).standard_normal(100_000)  # 100 chunks
        a = h.commit({"u": u})
        u[55_555] += 1.0
        b = h.commit({"u": u})
        from vlcc_adjoint._lineage._read import Reader

        reads = []
        original = Reader.read_chunk

        def counting(self, *args):
            reads.append(args[3])
            return original(self, *args)

        monkeypatch.setattr(Reader, "read_chunk", counting)
        d = h.diff(a, b)
        assert len(reads) == 2 and d["state['u']"].max_abs == pytest.approx(1.0)


def test_compare_checks_tolerances_and_names_the_first_differing_leaf(tmp_path):
    with History(tmp_path / "h") as h:
        s = {"a": np.ones(10), "b": np.full(10, 100.0), "c": np.zeros(3)}
        v0 = h.commit(s)
        s["b"] = s["b"] + 1e-9
        s["c"] = s["c"] + 1e-3
        v1 = h.commit(s)
        c = h.compare(v0, v1)
        assert isinstance(c, Comparison) and not c and not c.bitwise
        assert c.first_leaf == "state['b']" and "state['b']" in c.reason
        c = h.compare(v0, v1, rtol=1e-10)
        assert c.first_leaf == "state['c']" and c.max_abs == pytest.approx(1e-3)
        assert h.compare(v0, v1, rtol=1e-10, atol=2e-3).equal
        same = h.compare(v1, s)  # a version against a live state
        assert same.equal and same.bitwise and same.first_leaf is None
        z = h.commit({"a": np.ones(10), "b": np.full(10, 100.0), "c": np.array([-0.0, 0, 0])})
        assert h.compare(v0, z).equal and not h.compare(v0, z).bitwise  # -0.0 == 0.0


def test_compare_across_two_repositories(tmp_path):
    with History(tmp_path / "a") as ha, History(tmp_path / "b") as hb:
        va = ha.commit(small(1))
        vb = hb.commit(small(1))
        vc = hb.commit(small(2))
        assert ha.compare(va, vb, other=hb).bitwise
        assert not ha.compare(va, vc, other=hb).equal


# -- gc ------------------------------------------------------------------------------------


def test_gc_keeps_by_policy_splices_the_graph_and_frees_unused_chunks(tmp_path):
    with History(tmp_path / "h") as h:
        ids = [
            h.commit({"x": np.full(5000, float(k))}, meta={"loss": abs(k - 3) + 0.5})
            for k in range(8)
        ]
        h.tag("t", ids[1])
        h.branch("b", at=ids[5])
        h.checkout("b")
        b1 = h.commit({"x": np.full(5000, 100.0)}, meta={"loss": 9.0})
        h.checkout("main")
        before = h.usage()
        dry = h.gc(keep=KeepPolicy(last=2, best=("loss", "min")), dry_run=True)
        assert isinstance(dry, GCReport) and dry.dry_run and len(h) == 9
        report = h.gc(keep=KeepPolicy(last=2, best=("loss", "min")))
        kept = {ids[7], ids[6], b1, ids[5], ids[1], ids[3]}
        assert set(report.removed) == set(dry.removed) == set(ids) - kept
        assert {v.id for v in h.log(all=True)} == kept
        assert h.version(ids[3]).parents == (ids[1],)  # spliced over the removed ids[2]
        assert h.version(ids[5]).parents == (ids[3],)
        assert report.chunks_removed == 3 and report.bytes_freed >= 3 * 40000
        assert h.usage().chunk_bytes == before.chunk_bytes - 3 * 40000
        for k in (1, 3, 5, 6, 7):
            assert h.load(ids[k])["x"][0] == k
        assert h.gc(keep=0).removed == (ids[3], ids[5], ids[6])  # tips and tags stay
        assert {v.id for v in h.log(all=True)} == {ids[7], b1, ids[1]}
        assert h.gc(keep=KeepPolicy(last=0, tagged=False)).removed == (ids[1],)
        with pytest.raises(TypeError):
            h.gc(keep="all")
    with pytest.raises(ValueError):
        KeepPolicy(best=("loss", "median"))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["commit", "commit", "commit", "branch", "checkout", "tag", "merge"]),
            st.integers(0, 10**6),
        ),
        min_size=1,
        max_size=14,
    ),
    last=st.one_of(st.none(), st.integers(0, 3)),
    tagged=st.booleans(),
    best=st.sampled_from([None, ("m", "min"), ("m", "max")]),
    chunk=st.sampled_from([64, 256, 4096]),
)
def test_gc_never_removes_a_chunk_a_kept_version_needs(
    tmp_path_factory, ops, last, tagged, best, chunk
):
    path = tmp_path_factory.mktemp("prop") / "h"
    expected: dict[str, np.ndarray] = {}
    with History(path, chunk_bytes=chunk) as h:
        for op, r in ops:
            rng = np.random.default_rng(r)
            if op == "commit" or not expected:
                base = rng.integers(0, 4, size=int(rng.integers(0, 300))).astype(np.float64)
                x = np.repeat(base, 3)  # repeated content: shared and duplicate chunks
                vid = h.commit({"x": x, "k": r}, meta={"m": r % 97})
                expected[vid] = x.copy()
                continue
            ids = sorted(expected)
            target = ids[r % len(ids)]
            if op == "branch":
                h.branch(f"b{r % 3}", at=target, force=True)
            elif op == "checkout":
                h.checkout(sorted(h.branches)[r % len(h.branches)])
            elif op == "tag":
                h.tag(f"t{r % 2}", target, force=True)
            elif op == "merge" and h.head is not None:
                vid = h.commit({"x": expected[target], "k": -1}, merge=[target])
                expected[vid] = expected[target].copy()
        h.gc(keep=KeepPolicy(last=last, tagged=tagged, best=best))
        kept = {v.id for v in h.log(all=True)}
        assert set(h.branches.values()) <= kept
        if tagged:
            assert set(h.tags.values()) <= kept
        for vid in kept:
            assert np.array_equal(h.load(vid)["x"], expected[vid])
        gone = set(expected) - kept
        for vid in gone:
            assert not os.path.exists(path / "versions" / vid)
        referenced = set()
        for vid in kept:
            referenced |= h._reader.manifest(vid).addresses()
        on_disk = {
            e.name + f.name
            for e in os.scandir(path / "chunks")
            if e.is_dir()
            for f in os.scandir(e.path)
        }
        assert on_disk == referenced  # nothing missing, nothing leaked
        graph = h.graph
        assert all(p in kept for v in kept for p in h.version(v).parents)
        assert set(graph.nodes) == kept


# -- integrity -----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [None, Lossless()])
@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_tampered_chunk_is_detected_on_checkout(tmp_path, codec, damage):
    with History(tmp_path / "h", codec=codec, chunk_bytes=4096) as h:
        s = {"a": np.arange(100.0), "u": np.linspace(0, 1, 5000), "step": 7}
        vid = h.commit(s, meta={"step": 7})
        h.wait()
        layout, cfg, addrs = h._reader.manifest(vid).leaves[1]
        path = tmp_path / "h" / F.chunk_relpath(addrs[2])
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x10
            path.write_bytes(bytes(data))  # in place: every hard link sees it
        elif damage == "truncate":
            with open(path, "r+b") as f:
                f.truncate(len(data) - 8)
        else:
            path.unlink()
        with pytest.raises(CorruptCheckpointError) as err:
            h.checkout(vid)
        msg = str(err.value)
        assert vid in msg and "state['u']" in msg and "chunk 2" in msg
        assert err.value.key == vid and err.value.step == 7
        with pytest.raises(CorruptCheckpointError):
            h.diff(vid, {"a": s["a"], "u": s["u"] + 1, "step": 7})


def test_a_damaged_manifest_or_graph_is_reported_not_trusted(tmp_path):
    with History(tmp_path / "h") as h:
        vid = h.commit(small(1))
    manifest = tmp_path / "h" / "versions" / vid / "zarr.json"
    doc = json.loads(manifest.read_text())
    doc["attributes"]["vlcc_lineage"]["leaves"][0]["dtype"] = "|O"
    manifest.write_text(json.dumps(doc))
    with History(tmp_path / "h") as h:
        with pytest.raises(CorruptCheckpointError, match="manifest"):
            h.checkout(vid)
    (tmp_path / "h" / "graph" / "zarr.json").write_text('{"zarr_format": 3, "attributes": {}}')
    with pytest.raises(StorageError, match="graph file"):
        History(tmp_path / "h")


# -- dedup, zarr, compression --------------------------------------------------------------


def test_ten_versions_sharing_a_big_unchanged_leaf_cost_little_more_than_one(tmp_path):
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((2000, 500))  # 8 MB, never changes
    with History(tmp_path / "h") as h:
        for k in range(10):
            h.commit({"embedding": embedding, "head": rng.standard_normal(1000), "step": k})
        u = h.usage()
    one = embedding.nbytes + 8000
    assert u.logical_bytes == 10 * one
    assert u.disk_bytes < 1.05 * one  # + 9 * 8 KB of heads + metadata
    assert u.dedup_ratio > 9


def test_plain_zarr_reads_every_version_of_the_repository(tmp_path):
    zarr = pytest.importorskip("zarr")
    states = [rich_state(k) for k in range(2)]
    with History(tmp_path / "h", chunk_bytes=2048) as h:
        ids = [h.commit(s) for s in states]
        infos = h.leaves(ids[1])
    with History(tmp_path / "z", codec=Lossless(clevel=3, shuffle="bit")) as hz:
        zid = hz.commit(states[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no foreign files at any group level we list
        root = zarr.open_group(str(tmp_path / "h"), mode="r")
        assert set(root.keys()) == {"chunks", "graph", "versions", "locks", "scratch"}
        assert set(root["versions"].keys()) == set(ids)
        assert root["graph"].attrs["vlcc_lineage_graph"]["branches"]["main"] == ids[1]
        from vlcc_adjoint.state import flatten

        for vid, s in zip(ids, states):
            leaves, _ = flatten(s)
            for i, leaf in enumerate(leaves):
                got = np.asarray(root[f"versions/{vid}/{i}"][...])
                if got.dtype == np.uint8 and leaf.dtype != np.uint8:  # raw-byte dtypes
                    got = np.ascontiguousarray(got).view(leaf.dtype).reshape(leaf.shape)
                assert got.shape == leaf.shape
                assert got.astype(leaf.dtype).tobytes() == leaf.tobytes()  # byte order too
        assert infos[0].path == "state['u']" and infos[0].chunks > 1
        zroot = zarr.open_group(str(tmp_path / "z"), mode="r")
        assert np.array_equal(zroot[f"versions/{zid}/0"][...], states[1]["u"])
    # the version arrays hold hard links to the content-addressed chunks: no extra bytes
    leaf_dir = tmp_path / "h" / "versions" / ids[0] / "0"
    chunk_file = next(p for p in leaf_dir.iterdir() if p.name != "zarr.json")
    assert chunk_file.stat().st_nlink >= 2


def test_lossless_compression_roundtrips_and_lossy_codecs_are_refused(tmp_path):
    smooth = {"u": np.tile(np.linspace(0, 1, 1000), 200)}
    with History(tmp_path / "h", codec=Lossless()) as h:
        vid = h.commit(smooth)
        assert_same(h.checkout(vid), smooth)
        assert h.usage().chunk_bytes < smooth["u"].nbytes / 3
    with pytest.raises(ValueError, match="lossy"):
        History(tmp_path / "x", codec=ErrorBounded(1e-3))


def test_chunk_layout_covers_every_byte_once(tmp_path):
    for shape, dtype, chunk in [
        ((10, 7), "<f8", 64),
        ((3, 1000), "<f4", 900),
        ((5,), "V3", 4),
        ((), "<c16", 4),
        ((4, 0, 3), "<f8", 16),
        ((1001,), "|b1", 100),
        ((6, 5, 4), ">i2", 30),
    ]:
        layout = F.plan_layout(np.dtype(dtype), shape, chunk)
        spans = list(layout.spans())
        assert len(spans) == layout.nchunks
        covered = sum(valid for _, valid, _ in spans)
        assert covered == layout.nbytes
        offsets = [off for off, _, _ in spans]
        assert offsets == sorted(offsets) and len(set(k for _, _, k in spans)) == len(spans)
        entry = F.leaf_entry(layout, None, ["0" * 32] * layout.nchunks)
        assert F.layout_from_json(json.loads(json.dumps(entry))) == layout


# -- asynchrony, failures, concurrency, crashes ---------------------------------------------


def test_a_background_failure_surfaces_on_the_next_call_and_the_version_is_absent(
    tmp_path, monkeypatch
):
    with History(tmp_path / "h") as h:
        ok = h.commit(small(1))
        h.wait()

        def broken(self, *args):
            raise OSError(28, "No space left on device")

        from vlcc_adjoint._lineage._chunks import ChunkStore

        monkeypatch.setattr(ChunkStore, "store", broken)
        bad = h.commit(small(2))  # returns: the failure is in the background
        with pytest.raises(StorageError, match=f"version {bad}.*No space left"):
            h.wait()
        monkeypatch.undo()
        assert [v.id for v in h.log()] == [ok]
        assert h.commit(small(3)) and len(h) == 2
        assert not any(e.name.startswith("v-") for e in os.scandir(tmp_path / "h" / "scratch"))


_WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from vlcc_adjoint.lineage import History
    path, proc, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    h = History(path, chunk_bytes=4096)
    while not os.path.exists(go):
        time.sleep(0.005)
    for k in range(n):
        h.commit({"x": np.full(20000, 1000.0 * proc + k)}, message=f"p{proc} k{k}",
                 meta={"proc": proc, "k": k})
        if k % 3 == 0:
            h.wait()
    h.close()
""")


def test_concurrent_commits_from_two_processes_keep_every_version(tmp_path):
    path = tmp_path / "h"
    History(path).close()
    go = tmp_path / "go"
    n = 8
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(p), str(n), str(go)])
        for p in (1, 2)
    ]
    time.sleep(1.0)  # both import and open the repository
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with History(path, mode="r") as h:
        log = h.log()
        assert len(log) == len(h) == 2 * n
        chain = h._repo.graph.first_parents(h.branches["main"])
        assert chain == [v.id for v in log]  # one linear branch, nothing lost
        for proc in (1, 2):
            mine = [v for v in reversed(log) if v.meta["proc"] == proc]
            assert [v.meta["k"] for v in mine] == list(range(n))
            for v in mine:
                assert h.load(v.id)["x"][0] == 1000.0 * proc + v.meta["k"]


def test_histories_opened_at_once_on_a_new_directory_all_open_it(tmp_path):
    # Ranks of a job open one history together: each may see the others'
    # scratch files (".zarr.json.<pid>-<hex>.tmp") before the root exists.
    for k in range(5):
        path = tmp_path / f"h{k}"
        start = threading.Barrier(6)
        errors: list[BaseException] = []

        def open_it():
            start.wait()
            try:
                History(path).close()
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=open_it) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with History(path, mode="r") as h:
            assert len(h) == 0
    half_made = tmp_path / "half"
    half_made.mkdir()
    (half_made / ".zarr.json.4242-0123abcd.tmp").write_bytes(b"{")  # a creator died here
    History(half_made).close()
    with History(half_made, mode="r") as h:
        assert len(h) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / ".notes.json.4242-0123abcd.tmp").write_bytes(b"{")  # no file of a history
    with pytest.raises(StorageError, match="not empty and not a lineage history"):
        History(other)


_KILLED = textwrap.dedent("""
    import sys
    import numpy as np
    from vlcc_adjoint.lineage import History
    h = History(sys.argv[1], chunk_bytes=256 << 10)
    k = 0
    while True:
        x = np.random.default_rng(k).standard_normal(1 << 20)  # 8 MiB of new chunks
        h.commit({"x": x, "k": k}, meta={"k": k})
        if k % 4 == 3:
            h.wait()
            print(k, flush=True)
        k += 1
""")


def test_a_commit_killed_mid_write_is_invisible_and_the_repository_opens(tmp_path):
    path = tmp_path / "h"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(path)], stdout=subprocess.PIPE, text=True
    )
    proc.stdout.readline()
    proc.stdout.readline()
    time.sleep(0.13)  # somewhere inside later commits' chunk writes
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with History(path) as h:
        log = h.log()
        assert len(log) >= 8
        assert [v.meta["k"] for v in log] == list(range(len(log)))[::-1]
        for v in log[:3]:
            x = np.random.default_rng(v.meta["k"]).standard_normal(1 << 20)
            assert np.array_equal(h.load(v.id)["x"], x)
        report = h.gc()
        assert report.removed == ()
        assert not [e for e in os.scandir(path / "scratch") if e.name != "zarr.json"]
        vid = h.commit({"x": np.zeros(10), "k": -1})
        assert h.log()[0].id == vid


def test_leftovers_of_interrupted_commits_are_invisible_and_swept_by_gc(tmp_path):
    path = tmp_path / "h"
    with History(path) as h:
        vid = h.commit(small(1))
    # A commit killed before its rename: a half-built version group in scratch ...
    work = path / "scratch" / "v-0123456789ab-999-dead"
    (work / "0").mkdir(parents=True)
    (work / "0" / "c.0").write_bytes(b"\x00" * 100)
    (path / "scratch" / "c-999-dead").write_bytes(b"partial chunk")
    # ... and one killed between its rename and the graph update.
    orphan = path / "versions" / "fedcba987654"
    (orphan / "0").mkdir(parents=True)
    (orphan / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})
    )
    # ... and a chunk nobody references
    stray = path / "chunks" / "ff" / ("0" * 30)
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"x" * 64)
    with History(path, mode="r") as h:  # a reader changes nothing
        assert [v.id for v in h.log(all=True)] == [vid]
        assert work.exists() and (path / "scratch" / "c-999-dead").exists()
    with History(path) as h:  # a writer's open sweeps scratch/ (no commit in flight anywhere)
        assert not work.exists() and not (path / "scratch" / "c-999-dead").exists()
        assert [v.id for v in h.log(all=True)] == [vid]
        with pytest.raises(KeyError):
            h.resolve("fedcba987654")
        report = h.gc()
        assert report.debris_removed == 1 and report.chunks_removed == 1
        assert not orphan.exists() and not work.exists() and not stray.exists()
        assert h.load(vid)["step"] == 1


def test_commit_waits_when_pending_bytes_exceed_the_budget(tmp_path):
    with History(tmp_path / "h", max_pending_bytes=1 << 20) as h:
        rng = np.random.default_rng(0)
        ids = [h.commit({"x": rng.standard_normal(100_000)}) for _ in range(6)]
        assert h._commits.pending_bytes <= 1 << 20
        h.wait()
        assert len(h) == 6 and h.stats["commits"] == 6 and h.stats["new_bytes"] >= 6 * 800_000
        assert [v.id for v in h.log()] == ids[::-1]


def test_durable_mode_and_reopening_read_only(tmp_path):
    with History(tmp_path / "h", durable=True) as h:
        vid = h.commit(rich_state())
    with History(tmp_path / "h", mode="r") as h:
        assert_same(h.load(vid), rich_state())
        with pytest.raises(StorageError, match="read-only"):
            h.commit(small(1))
        with pytest.raises(StorageError, match="read-only"):
            h.gc()


def test_opening_something_else_is_a_clear_error(tmp_path):
    with ZarrTier(tmp_path / "tier") as tier:
        tier.put("a", make_record({"step": 1}, [np.ones(3)]))
    with pytest.raises(StorageError, match="ZarrTier"):
        History(tmp_path / "tier")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(StorageError, match="not empty"):
        History(tmp_path / "junk")
    with pytest.raises(StorageError, match="mode='r'"):
        History(tmp_path / "missing", mode="r")
    h = History(tmp_path / "h")
    h.close()
    with pytest.raises(StorageError, match="closed"):
        h.log()
    with pytest.raises(TypeError, match="JSON"):
        History(tmp_path / "h2").commit(small(1), meta={"a": object()})


def test_metadata_is_strict_json(tmp_path):
    with History(tmp_path / "h") as h:
        vid = h.commit(
            small(1),
            meta={
                "loss": float("nan"),
                "lr": np.float32(0.5),
                "shape": (2, 3),
                "hist": [float("inf")],
            },
        )
        assert h.version(vid).meta == {"loss": "nan", "lr": 0.5, "shape": [2, 3], "hist": ["inf"]}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_must_open_its_own_history(tmp_path):
    with History(tmp_path / "h") as h:
        h.commit(small(1))
        h.wait()
        pid = os.fork()
        if pid == 0:
            try:
                h.log()
                os._exit(1)
            except StorageError as err:
                os._exit(0 if "another process" in str(err) else 2)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0


# -- export / import, CLI -------------------------------------------------------------------


def test_export_import_recreates_the_history_with_chunks_stored_once(tmp_path):
    big = np.random.default_rng(0).standard_normal(200_000)
    with History(tmp_path / "h") as h:
        ids = [h.commit({"big": big, "k": k}, meta={"k": k}) for k in range(5)]
        h.tag("v1", ids[1])
        out = h.export(tmp_path / "run.tar")
    with tarfile.open(out) as tar:
        members = tar.getmembers()
        assert sum(m.isfile() and m.size >= 100_000 for m in members) <= 2
        assert any(m.islnk() for m in members)
    assert os.path.getsize(out) < 1.3 * big.nbytes
    dest = import_history(out, tmp_path / "moved")
    with History(dest) as h:
        assert [v.id for v in h.log()] == ids[::-1] and h.tags == {"v1": ids[1]}
        assert np.array_equal(h.checkout("v1")["big"], big)
        assert h.version(h.commit({"big": big, "k": 9}, branch="from-v1")).parents == (ids[1],)
    with pytest.raises(StorageError, match="empty directory"):
        import_history(out, tmp_path / "moved")
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        tar.add(__file__, arcname="../escape.py")
    with pytest.raises(StorageError, match="not a history archive"):
        import_history(evil, tmp_path / "nowhere")


def test_cli_log_show_diff_gc_inspect_export_import(tmp_path, capsys):
    path = str(tmp_path / "h")
    with History(path) as h:
        a = h.commit({"u": np.zeros(100)}, message="first", meta={"step": 0})
        b = h.commit({"u": np.ones(100)}, message="second", meta={"step": 1})
        h.branch("exp", at=a)
        h.checkout("exp")
        c = h.commit({"u": np.full(100, 2.0)}, message="experiment")
        h.tag("keep-me", a)
    assert vlcc(["log", path]) == 0
    out = capsys.readouterr().out
    assert f"{c} (HEAD -> exp) experiment" in out and f"{b} (main) second" in out
    assert "|/" in out and "tag: keep-me" in out
    assert vlcc(["log", path, "--branch", "main", "-n", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"* {b} (main) second"
    assert vlcc(["show", path, "main"]) == 0
    out = capsys.readouterr().out
    assert b in out and "second" in out and "state['u']" in out and '"step": 1' in out
    assert vlcc(["diff", path, "main", "exp"]) == 0
    assert "changed" in capsys.readouterr().out
    assert vlcc(["diff", path, "main", "exp", "--atol", "0.5", "--exit-code"]) == 1
    assert "NOT equal" in capsys.readouterr().out
    assert vlcc(["gc", path, "--keep-last", "1", "--no-keep-tagged", "--dry-run"]) == 0
    assert "would remove 1 versions" in capsys.readouterr().out
    assert vlcc(["gc", path, "--keep-last", "1"]) == 0
    assert "removed 0 versions" in capsys.readouterr().out  # the tag keeps it
    assert vlcc(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "3 " in out and "branch exp" in out and "deduplication" in out
    archive = str(tmp_path / "h.tar.gz")
    assert vlcc(["export", path, archive]) == 0
    assert vlcc(["import", archive, str(tmp_path / "h2")]) == 0
    assert "3 versions" in capsys.readouterr().out
    assert vlcc(["show", path, "nope"]) == 2
    assert "names no branch, tag or version" in capsys.readouterr().err
    result = subprocess.run(
        [sys.executable, "-m", "vlcc_adjoint", "log", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_cli_inspect_summarises_a_zarrtier_store_without_changing_it(tmp_path, capsys):
    with ZarrTier(tmp_path / "tier") as tier:
        for step in (3, 5):
            tier.put(f"u{step}", make_record({"step": step}, [np.ones(10)]))
    before = sorted(os.listdir(tmp_path / "tier"))
    assert vlcc(["inspect", str(tmp_path / "tier")]) == 0
    out = capsys.readouterr().out
    assert "ZarrTier store" in out and "records   2" in out and "3 .. 5" in out
    assert sorted(os.listdir(tmp_path / "tier")) == before
