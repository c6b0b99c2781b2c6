"""The torch.distributed.checkpoint backend on a History (one process; see test_dcp_dist.py)."""

from __future__ import annotations

import glob
import json
import os
import threading
import warnings
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from vlcc_adjoint.lineage import CorruptCheckpointError, History  # noqa: E402
from vlcc_adjoint.torch.dcp import VlccReader, VlccWriter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _train_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _state(model, opt):
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "scalar": torch.tensor(2.75, dtype=torch.float64),
        "half": torch.arange(7, dtype=torch.bfloat16) / 3,
        "empty": torch.zeros(0, 3),
        "flags": torch.tensor([True, False]),
        "big": torch.randn(200, 100),  # 80 kB: a leaf of its own (smaller ones are packed)
        "extra": {
            "epoch": 3,
            "name": "run",
            "hist": (1, 2.5, None, float("inf")),
            "raw": b"\x00\xff",
            "pairs": ((1, "a"), {2: "b", 2.5: None}),
        },
    }


def _blank(sd):
    """A state dict of the same structure with zeroed tensors and placeholder objects."""
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return {k: _blank(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_blank(v) for v in sd]
    return None


def _assert_equal(a, b, where="sd"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b and type(a) is type(b), where


def test_dcp_save_load_round_trip_is_exact(tmp_path):
    model, opt = _train_state()
    sd = _state(model, opt)
    writer = VlccWriter(tmp_path / "run.vlcc", message="first", step=10)
    dcp.save(sd, storage_writer=writer)
    assert writer.version is not None
    out = _blank(sd)
    out["optim"] = _train_state(seed=1)[1].state_dict()  # a different optimizer state
    out["extra"] = {"epoch": 0, "name": "", "hist": None, "raw": None, "pairs": None}
    reader = VlccReader(tmp_path / "run.vlcc")
    dcp.load(out, storage_reader=reader)
    assert reader.version == writer.version
    _assert_equal(sd["model"], out["model"])
    _assert_equal(sd["optim"]["state"], out["optim"]["state"])
    assert out["optim"]["param_groups"] == sd["optim"]["param_groups"]
    assert out["scalar"].shape == () and out["scalar"].item() == 2.75  # 0-d stays 0-d
    _assert_equal(sd["half"], out["half"])
    _assert_equal(sd["empty"], out["empty"])
    _assert_equal(sd["flags"], out["flags"])
    _assert_equal(sd["big"], out["big"])
    _assert_equal(sd["extra"], out["extra"])
    first = writer.version
    assert dcp.save(sd, storage_writer=writer).storage_data["vlcc_version"] == writer.version
    with History(tmp_path / "run.vlcc", mode="r") as h:
        v = h.log()[1]
        assert (
            v.id == first
            and h.log()[0].parents == (first,)
            and v.message == "first"
            and v.meta["step"] == 10
        )
        assert v.meta["dcp"]["format"] == "vlcc-dcp/1"
        plain = h.load(v.id)  # an ordinary version: History reads it too
        assert np.array_equal(plain["items"]["big@0,0"], sd["big"].numpy())
        assert [k for k in plain["items"] if k.startswith("__pack__.")] == ["__pack__.0.0"]


def test_every_save_is_a_version_and_refs_load_older_ones(tmp_path):
    path = tmp_path / "run.vlcc"
    w = torch.zeros(300, 40)
    writer = VlccWriter(path, tags=())
    saved = []
    for k in range(4):
        w += k + 1
        writer.message, writer.step = f"step {k}", k
        dcp.save({"w": w, "k": k}, storage_writer=writer)
        saved.append((writer.version, w.clone()))
    dcp.save(
        {"w": w * 0 - 1, "k": 99}, storage_writer=VlccWriter(path, branch="side", tags=("exp",))
    )
    with History(path, mode="r") as h:
        main = h.log("main")
        assert [v.id for v in main] == [v for v, _ in reversed(saved)]
        assert [v.parents for v in main[:-1]] == [(v,) for v, _ in reversed(saved[:-1])]
        assert h.tags["exp"] == h.branches["side"]
        assert h.version("side").parents == (saved[-1][0],)  # branched at main's tip
    for back in range(4):
        out = {"w": torch.empty(300, 40), "k": -1}
        dcp.load(out, storage_reader=VlccReader(path, ref=f"main~{back}"))
        assert torch.equal(out["w"], saved[3 - back][1]) and out["k"] == 3 - back
    out = {"w": torch.empty(300, 40), "k": -1}
    dcp.load(out, storage_reader=VlccReader(path, ref="exp"))
    assert out["k"] == 99 and bool((out["w"] == -1).all())
    # Backtrack: a new branch from the version two saves back, as loaded.
    reader = VlccReader(path, ref="main~2")
    writer = VlccWriter(path, branch="retry", at=reader.version)
    for k in range(2):
        dcp.save({"w": w * 0 + 7 + k, "k": 50 + k}, storage_writer=writer)
    with History(path, mode="r") as h:
        assert [v.parents for v in h.log("retry")[:3]] == [
            (h.log("retry")[1].id,),
            (saved[1][0],),
            (saved[0][0],),
        ]
    with pytest.raises(CheckpointException, match="names no version"):
        dcp.save({"w": w}, storage_writer=VlccWriter(path, branch="x", at="nope"))
    with pytest.raises(CheckpointException, match="already names version"):
        dcp.save({"w": w}, storage_writer=VlccWriter(path, tags=("exp",)))


def test_deltas_store_a_small_change_as_a_small_delta(tmp_path):
    path = tmp_path / "run.vlcc"
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.standard_normal(1 << 20).astype(np.float32))  # 4 MiB
    writer = VlccWriter(path, deltas=True)
    dcp.save({"w": w}, storage_writer=writer)
    with History(path, mode="r") as h:
        first = h.usage().chunk_bytes
    w2 = w.clone()
    w2[1000:1100] += 1.0  # 400 bytes of one chunk
    dcp.save({"w": w2}, storage_writer=writer)
    with History(path, mode="r") as h:
        assert h.deltas
        grown = h.usage().chunk_bytes - first
    assert 0 < grown < 64 << 10  # not a whole 1 MiB chunk again
    for ref, want in (("main", w2), ("main~1", w)):
        out = {"w": torch.empty_like(w)}
        dcp.load(out, storage_reader=VlccReader(path, ref=ref))
        assert torch.equal(out["w"], want)


def test_unchanged_tensors_are_stored_once(tmp_path):
    path = tmp_path / "run.vlcc"
    big = torch.randn(512, 1024)  # 2 MiB
    writer = VlccWriter(path)
    dcp.save({"big": big, "small": torch.zeros(3)}, storage_writer=writer)
    with History(path, mode="r") as h:
        first = h.usage().chunk_bytes
    assert writer.written_bytes >= big.numel() * 4
    dcp.save({"big": big, "small": torch.ones(3)}, storage_writer=writer)
    assert 0 < writer.written_bytes < 16 << 10  # the small tensor and the metadata
    with History(path, mode="r") as h:
        assert h.usage().chunk_bytes - first == writer.written_bytes


def test_packs_of_unchanged_small_tensors_are_not_written_again(tmp_path):
    # A frozen base's small tensors (norms, biases) beside changing adapters, all
    # small enough to be packed: once a save has seen which ones stay the same, a
    # save writes the packs of the changed ones and the metadata, nothing more.
    path = tmp_path / "run.vlcc"
    gen = torch.Generator().manual_seed(0)
    frozen = {f"norm{i}": torch.randn(1000, generator=gen) for i in range(40)}  # 160 kB

    def state(step):
        return {
            "base": dict(frozen),
            "adapter": {f"a{i}": torch.full((500,), float(step + i)) for i in range(8)},
        }

    changed = 8 * 500 * 4
    writer = VlccWriter(path)
    sizes = []
    for step in range(4):
        dcp.save(state(step), storage_writer=writer)
        sizes.append(writer.written_bytes)
    assert sizes[0] > 160_000 and sizes[1] > 160_000  # the frozen ones in a pack of their own
    for written in sizes[2:]:
        assert changed <= written < changed + 4096  # + the compressed metadata document
    with History(path, mode="r") as h:
        v2, v3 = h.log()[1].id, h.log()[0].id
        plain2, plain3 = h.load(v2)["items"], h.load(v3)["items"]
        packs = sorted(k for k in plain3 if k.startswith("__pack__."))
        assert len(packs) == 2 and np.array_equal(plain2[packs[0]], plain3[packs[0]])
        assert plain3[packs[0]].nbytes == 160_000
    out = {
        "base": {k: torch.empty(1000) for k in frozen},
        "adapter": {f"a{i}": torch.empty(500) for i in range(8)},
    }
    dcp.load(out, storage_reader=VlccReader(path))
    for k, t in state(3)["base"].items():
        assert torch.equal(out["base"][k], t)
    for k, t in state(3)["adapter"].items():
        assert torch.equal(out["adapter"][k], t)


def test_a_truncated_metadata_document_is_refused(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(10.0)}, storage_writer=VlccWriter(path))
    with History(path) as h:  # checksums valid, the compressed stream cut short
        (v,) = h.log()
        state = h.load(v.id)
        state["dcp_metadata"] = state["dcp_metadata"][:-5]
        h.commit(state, branch="cut", meta=v.meta)
        h.wait()
    with pytest.raises(CorruptCheckpointError, match="cut short"):
        VlccReader(path, ref="cut")


def test_async_save_stages_into_one_reused_area_of_the_shard_size(tmp_path):
    path = tmp_path / "run.vlcc"
    model, opt = _train_state()
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "s": torch.tensor(1)}
    shard = sum(
        t.numel() * t.element_size()
        for t in list(sd["model"].values())
        + [sd["s"]]
        + [v for st in sd["optim"]["state"].values() for v in st.values()]
    )
    writer = VlccWriter(path)
    pointers, snaps = [], []
    for k in range(3):
        snaps.append({k: v.clone() for k, v in model.state_dict().items()})
        fut = dcp.async_save(sd, storage_writer=writer)
        pointers.append(writer.staging.buffer.data_ptr())
        # Training goes on while the save writes: the staged copy must not change.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        fut.result()
    assert writer.staging.nbytes <= 1.25 * shard
    assert writer.staging.shard_bytes == shard
    assert len(set(pointers)) == 1 and writer.staging.reallocations == 1
    with History(path, mode="r") as h:
        assert len(h.log()) == 3
    for back in range(3):
        out = {"model": {k: torch.empty_like(v) for k, v in model.state_dict().items()}}
        dcp.load(out, storage_reader=VlccReader(path, ref=f"main~{back}"))
        _assert_equal(snaps[2 - back], out["model"])


def test_writer_pickles_without_its_history_and_staging_area(tmp_path):
    import pickle

    writer = VlccWriter(tmp_path / "run.vlcc", branch="b", message="m", tags=("t",), step=3)
    dcp.async_save({"w": torch.ones(5)}, storage_writer=writer).result()
    copy = pickle.loads(pickle.dumps(writer))
    assert (copy.path, copy.branch, copy.message, copy.tags, copy.step) == (
        writer.path,
        "b",
        "m",
        ("t",),
        3,
    )
    assert copy.staging.nbytes == 0 and writer.staging.nbytes == 20
    copy.tags = ()
    dcp.save({"w": torch.zeros(5)}, storage_writer=copy)
    with History(tmp_path / "run.vlcc", mode="r") as h:
        assert [v.message for v in h.log("b")] == ["m", "m"]


def _fsynced(monkeypatch) -> list[str]:
    """The paths fsynced from now on (through the format layer's ``os.fsync``)."""
    from vlcc_adjoint.storage import format as SF

    seen: list[str] = []
    fsync = SF.os.fsync

    def counting(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fsync(fd)

    monkeypatch.setattr(SF.os, "fsync", counting)
    return seen


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_durable_writer_fsyncs_chunks_directories_and_refs_and_the_default_does_not(
    tmp_path, monkeypatch
):
    import pickle

    seen = _fsynced(monkeypatch)
    sd = {"big": torch.randn(300, 100), "small": torch.ones(3), "k": 1}
    plain = VlccWriter(tmp_path / "plain.vlcc")
    assert plain.durable is False
    dcp.save(sd, storage_writer=plain)
    plain.close()
    assert seen == []  # the default: page cache only, as before
    path = str(tmp_path / "durable.vlcc")
    writer = VlccWriter(path, durable=True)
    assert pickle.loads(pickle.dumps(writer)).durable is True  # travels to other processes
    dcp.save(sd, storage_writer=writer)
    inside = [p for p in seen if p == path or p.startswith(path + os.sep)]
    assert inside == seen  # nothing outside the history
    assert any(os.path.isdir(p) for p in inside)  # directory entries
    with History(path, mode="r") as h:
        chunk_files = {p for p in glob.glob(f"{path}/**", recursive=True) if "chunks" in p}
        assert chunk_files & set(seen)  # the chunk files the version references
        assert h.log()[0].id == writer.version
    first = len(seen)
    dcp.save(sd, storage_writer=writer)  # nothing new but the version: still fsynced
    assert len(seen) > first
    writer.close()
    out = {"big": torch.empty(300, 100), "small": torch.empty(3), "k": 0}
    dcp.load(out, storage_reader=VlccReader(path))
    assert torch.equal(out["big"], sd["big"]) and out["k"] == 1


def test_a_save_failing_after_staging_adds_no_version_and_gc_sweeps_its_chunks(tmp_path):
    class FailsAtCommit(VlccWriter):
        def finish(self, metadata, results):
            raise OSError("the coordinator lost its disk")

    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.ones(100_000)}, storage_writer=VlccWriter(path))
    with History(path) as h:
        before = h.usage().chunk_bytes
    with pytest.raises(CheckpointException, match="lost its disk"):
        dcp.save({"w": torch.randn(100_000)}, storage_writer=FailsAtCommit(path))
    with History(path) as h:
        assert len(h.log(all=True)) == 1
        assert h.usage().chunk_bytes > before  # the staged, unreferenced chunks
        report = h.gc()
        assert report.removed == () and report.chunks_removed >= 1
        assert h.usage().chunk_bytes == before
        assert torch.equal(torch.from_numpy(h.load("main")["items"]["w@0"]), torch.ones(100_000))


def test_a_bad_branch_name_commits_nothing(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.ones(4)}, storage_writer=VlccWriter(path))
    with pytest.raises(CheckpointException, match="branch"):
        dcp.save({"w": torch.ones(4)}, storage_writer=VlccWriter(path, branch="bad name~1"))
    with History(path, mode="r") as h:
        assert len(h.log(all=True)) == 1 and list(h.branches) == ["main"]


def test_background_staging_overlaps_the_copy_and_saves_what_was_staged(tmp_path):
    path = tmp_path / "run.vlcc"
    w = torch.randn(256, 256)
    writer = VlccWriter(path, background=True)
    snaps = []
    for k in range(2):
        snaps.append(w.clone())
        resp = dcp.async_save({"w": w}, storage_writer=writer)
        resp.staging_completion.result()  # before the optimizer step changes w
        w.add_(1.0)
        resp.upload_completion.result()
    assert writer.staging.reallocations == 1 and writer.staging.nbytes == w.numel() * 4
    for back in range(2):
        out = {"w": torch.empty_like(w)}
        dcp.load(out, storage_reader=VlccReader(path, ref=f"main~{back}"))
        assert torch.equal(out["w"], snaps[1 - back])
    writer.close()
    assert writer.staging.nbytes == 0


def test_staging_area_waits_for_the_save_that_uses_it():
    from vlcc_adjoint.torch._dcp_stage import StagingArea

    area = StagingArea(timeout=0.3)
    sd = {"a": torch.arange(10.0), "b": [torch.ones(3, dtype=torch.int8)], "c": 5}
    staged = area.stage(sd)
    assert torch.equal(staged["a"], sd["a"]) and staged["c"] == 5
    assert area.nbytes == area.shard_bytes == 43
    with pytest.raises(TimeoutError, match="still uses its staging area"):
        area.stage(sd)  # the first staged copy is alive and was not released
    del staged  # a save that failed before writing drops it: the area is free again
    again = area.stage(sd)
    area.release()
    assert torch.equal(again["b"][0], sd["b"][0]) and area.reallocations == 1


def test_staging_copies_every_kind_of_tensor_by_value():
    # Contiguous plain tensors are copied as bytes; views whose bytes are not
    # their values (conjugate, negative, transposed) go through copy_.
    from vlcc_adjoint.torch._dcp_stage import StagingArea

    torch.manual_seed(4)
    z = torch.randn(5, dtype=torch.complex64)
    sd = {
        "f32": torch.randn(33, 7),
        "bf16": torch.randn(9).to(torch.bfloat16),
        "f16": torch.randn(4, 3).half(),
        "i8": torch.arange(-5, 6, dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "conj": z.conj(),
        "neg": torch._neg_view(z),
        "t": torch.randn(6, 4).t(),
        "slice": torch.randn(10)[3:8],
        "grad": torch.randn(3, requires_grad=True),
    }
    area = StagingArea()
    for _ in range(2):  # a fresh area, then the reused one
        staged = area.stage(sd)
        for k, v in sd.items():
            got = staged[k]
            assert got.dtype == v.dtype and got.shape == v.shape, k
            assert torch.equal(
                got.resolve_conj().resolve_neg(), v.detach().resolve_conj().resolve_neg()
            ), k
        area.release()
    assert area.reallocations == 1


def test_a_large_staging_copy_is_split_between_two_threads_byte_for_byte(monkeypatch):
    # From PARALLEL_BYTES on, half of the bytes are copied by the area's helper
    # thread: the tensor across the middle is split, every byte lands once.
    from vlcc_adjoint.torch import _dcp_stage
    from vlcc_adjoint.torch._dcp_stage import StagingArea

    monkeypatch.setattr(_dcp_stage, "PARALLEL_BYTES", 1 << 12)
    threads: set[str] = set()
    real = _dcp_stage._copy_all

    def copy_all(pairs):
        threads.add(threading.current_thread().name)
        real(pairs)

    monkeypatch.setattr(_dcp_stage, "_copy_all", copy_all)
    torch.manual_seed(5)
    sd = {
        "a": torch.randn(1001),
        "b": [torch.randn(3, 333).half(), torch.arange(777, dtype=torch.int8)],
        "t": torch.randn(40, 30).t(),  # not a byte copy: copy_ in the caller
        "small": torch.ones(2),
    }
    area = StagingArea()
    staged = area.stage(sd)
    assert area.parallel_copies == 1 and len(threads) == 2
    assert torch.equal(staged["a"], sd["a"]) and torch.equal(staged["t"], sd["t"])
    assert all(torch.equal(x, y) for x, y in zip(staged["b"], sd["b"]))
    assert torch.equal(staged["small"], sd["small"])
    area.release()
    first, second = _dcp_stage._halves(
        [(np.zeros(n, np.uint8), np.ones(n, np.uint8)) for n in (5, 8, 1)]
    )
    assert [d.size for d, _ in first] == [5, 2] and [d.size for d, _ in second] == [6, 1]
    area.close()


def test_a_failing_rank_write_commits_no_version(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.ones(4)}, storage_writer=VlccWriter(path))
    with pytest.raises(CheckpointException, match="does not store"):
        dcp.save({"w": torch.zeros(4), "bad": object()}, storage_writer=VlccWriter(path))
    with History(path, mode="r") as h:
        assert len(h.log()) == 1
    out = {"w": torch.empty(4)}
    with VlccReader(path) as reader:
        dcp.load(out, storage_reader=reader)
    assert bool((out["w"] == 1).all())


# -- errors ------------------------------------------------------------------------


def test_reader_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no history"):
        VlccReader(tmp_path / "missing")
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.ones(4)}, storage_writer=VlccWriter(path))
    with pytest.raises(KeyError, match="names no version"):
        VlccReader(path, ref="main~5")
    with pytest.raises(KeyError, match="names no version"):
        VlccReader(path, ref="nope")
    with History(path) as h:  # a version written by something else
        h.commit({"w": np.ones(4)}, branch="plain")
    with pytest.raises(ValueError, match="not written by VlccWriter"):
        VlccReader(path, ref="plain")
    with History(path) as h:  # one that claims to be, with no JSON document first
        h.commit(
            {"dcp_metadata": np.zeros(3), "items": {}},
            branch="fake",
            meta={"dcp": {"format": "vlcc-dcp/1"}},
        )
    with pytest.raises(CorruptCheckpointError, match="metadata leaf is <f8"):
        VlccReader(path, ref="fake")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        VlccWriter(tmp_path / "file")


def _version_files(path, leaf):
    (vdir,) = [d for d in glob.glob(os.path.join(path, "versions", "*")) if os.path.isdir(d)]
    return sorted(glob.glob(os.path.join(vdir, str(leaf), "c*")))


def _flip(file):
    os.chmod(file, 0o644)
    with open(file, "r+b") as f:
        f.seek(3)
        b = f.read(1)
        f.seek(3)
        f.write(bytes([b[0] ^ 0x10]))


def test_damaged_tensor_bytes_raise_corrupt_checkpoint_error_naming_the_file(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(1000.0)}, storage_writer=VlccWriter(path))
    reader = VlccReader(path)  # the metadata is intact
    (chunk,) = _version_files(path, 1)
    _flip(chunk)  # a hard link: the content-addressed chunk file is damaged too
    with pytest.raises(CheckpointException) as info:
        dcp.load({"w": torch.empty(1000)}, storage_reader=reader)
    (err,) = [e[0] if isinstance(e, tuple) else e for e in info.value.failures.values()]
    assert isinstance(err, CorruptCheckpointError) and err.path is not None
    assert "chunks" in err.path


def test_damaged_metadata_raises_corrupt_checkpoint_error(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(10.0)}, storage_writer=VlccWriter(path))
    (chunk,) = _version_files(path, 0)
    _flip(chunk)
    with pytest.raises(CorruptCheckpointError) as info:
        VlccReader(path)
    assert info.value.path is not None


def _craft(path, edit):
    """Rewrite a saved version's metadata document with `edit`, keeping every checksum valid
    (a crafted store: the bytes are consistent, their meaning is not)."""
    with History(path) as h:
        (v,) = h.log()
        assert v.meta["dcp"]["document"] == "zlib"
        doc = json.loads(zlib.decompress(h.read_leaf(v.id, 0).tobytes()))
        state = h.load(v.id)
        edit(doc)
        state["dcp_metadata"] = np.frombuffer(zlib.compress(json.dumps(doc).encode()), np.uint8)
        h.commit(state, branch="crafted", meta=v.meta)
        h.wait()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["items"][0].update(dtype="object"), "unknown dtype"),
        (lambda d: d["items"][0]["chunks"][0].update(leaf=7), "names leaf"),
        (lambda d: d["items"][0]["chunks"][0].update(sizes=[11]), "outside its size"),
        (lambda d: d["items"][0]["chunks"][0].update(sizes=[5]), "cover 5 of its 10"),
        (lambda d: d["items"][0]["chunks"][0].update(offset=10**6), "lies in its bytes"),
        (lambda d: d.update(format="pickle"), "not a vlcc-dcp/1"),
        (lambda d: d["items"][1].update(value={"$x": 1}), "unknown stored value"),
    ],
)
def test_crafted_metadata_is_refused(tmp_path, edit, match):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(10.0), "n": 5}, storage_writer=VlccWriter(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _craft(path, lambda d: d["items"].sort(key=lambda it: it["kind"] != "tensor") or edit(d))
    try:
        reader = VlccReader(path, ref="crafted")
    except CorruptCheckpointError as err:
        assert match in str(err)
        return
    # Consistent enough to open: the load itself refuses it.
    with pytest.raises(CheckpointException, match=match):
        dcp.load({"w": torch.empty(10), "n": 0}, storage_reader=reader)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda text: text.replace('{"format"', '{"format": "x", "format"', 1), "duplicate key"),
        (lambda text: text.replace('"items"', '"nan": NaN, "items"', 1), "NaN"),
    ],
)
def test_metadata_that_is_not_strict_json_is_refused(tmp_path, edit, match):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(10.0)}, storage_writer=VlccWriter(path))
    with History(path) as h:
        (v,) = h.log()
        text = zlib.decompress(h.read_leaf(v.id, 0).tobytes()).decode()
        assert text.startswith('{"format"') and '"items"' in text
        state = h.load(v.id)
        state["dcp_metadata"] = np.frombuffer(zlib.compress(edit(text).encode()), np.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h.commit(state, branch="crafted", meta=v.meta)
        h.wait()
    with pytest.raises(CorruptCheckpointError, match=match):
        VlccReader(path, ref="crafted")


def test_stateful_app_state_with_get_state_dict_round_trips(tmp_path):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class App(Stateful):  # the torchtitan pattern
        def __init__(self, model, opt):
            self.model, self.opt = model, opt

        def state_dict(self):
            msd, osd = get_state_dict(self.model, self.opt)
            return {"model": msd, "optim": osd}

        def load_state_dict(self, sd):
            set_state_dict(
                self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
            )

    model, opt = _train_state(0)
    dcp.save({"app": App(model, opt)}, storage_writer=VlccWriter(tmp_path / "run.vlcc"))
    model2, opt2 = _train_state(1)
    dcp.load({"app": App(model2, opt2)}, storage_reader=VlccReader(tmp_path / "run.vlcc"))
    _assert_equal(model.state_dict(), model2.state_dict())
    _assert_equal(opt.state_dict()["state"], opt2.state_dict()["state"])
    assert opt.state_dict()["param_groups"] == opt2.state_dict()["param_groups"]


def test_crafted_shape_of_an_own_leaf_is_refused(tmp_path):
    path = tmp_path / "run.vlcc"
    dcp.save({"w": torch.arange(20000.0)}, storage_writer=VlccWriter(path))  # 80 kB: own leaf

    def edit(d):
        d["items"][0]["size"] = [10000]
        d["items"][0]["chunks"][0]["sizes"] = [10000]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _craft(path, edit)
    with pytest.raises(CorruptCheckpointError, match="the metadata says"):
        VlccReader(path, ref="crafted")
