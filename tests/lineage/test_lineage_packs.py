"""Packs and the node-local tier in one process (``comm=MPI.COMM_SELF, local=dir``).

A packed version's chunks live in one pack file per node (``packs/``) with a
checksummed index; these tests pin what the chunk layer promises of packs:
reads (serial and distributed) bit for bit, damage named by the pack file,
crafted indexes refused before anything is read or allocated, gc keeping a
pack while a kept version uses one of its chunks, deduplication across loose
chunks and packs, export to a plain zarr copy, and the tier's publication
protocol (visible after ``wait``; a failed flush raises and adds nothing).
The same tier on several ranks runs under mpiexec in tests/mpi.
"""

from __future__ import annotations

import fcntl
import glob
import os
import struct

import numpy as np
import pytest
import xxhash

from vlcc_adjoint.lineage import CorruptCheckpointError, History, import_history

MPI = pytest.importorskip("mpi4py.MPI")

from vlcc_adjoint.mpi import AgreedError, Decomposition, DistributedArray  # noqa: E402


def _state(u: np.ndarray, t: float = 1.0) -> dict:
    d = Decomposition.split(u.shape, (1,) * u.ndim)
    return {"u": DistributedArray(u.copy(), d, 0), "t": t, "k": np.arange(5, dtype=np.int16)}


def _local(tmp_path, **kw) -> History:
    return History(
        tmp_path / "h", comm=MPI.COMM_SELF, local=tmp_path / "local", chunk_bytes=4096, **kw
    )


@pytest.fixture
def u() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((300, 40))


def _packs(tmp_path) -> list[str]:
    return sorted(glob.glob(str(tmp_path / "h" / "packs" / "*.pack")))


def test_a_local_commit_is_published_by_wait_as_one_pack_and_reads_bitwise(tmp_path, u):
    with _local(tmp_path) as h:
        vid = h.commit(_state(u), message="v1")
        assert len(h) == 0  # staged, flushing: not visible yet
        h.wait()
        assert [v.id for v in h.log()] == [vid]
        assert h.load(vid)["u"].local.tobytes() == u.tobytes()
    assert len(_packs(tmp_path)) == 1
    # the version's group is its manifest only: no per-chunk file on the shared path
    assert os.listdir(tmp_path / "h" / "versions" / vid) == ["zarr.json"]
    assert glob.glob(str(tmp_path / "h" / "chunks" / "*" / "*")) == []
    with History(tmp_path / "h", mode="r") as h:
        state = h.load(vid)
        assert state["u"].tobytes() == u.tobytes() and state["t"] == 1.0
        assert h.verify()
    assert os.listdir(tmp_path / "local") == []  # close removed the staging directory


def test_a_second_commit_publishes_the_first_and_unchanged_chunks_cost_nothing(tmp_path, u):
    with _local(tmp_path) as h:
        v1 = h.commit(_state(u), message="v1")
        u2 = u.copy()
        u2[:3] += 1.0
        v2 = h.commit(_state(u2, 2.0), message="v2")  # waits for v1's flush, publishes it
        assert [v.id for v in h.log()] == [v1]
        before = h.stats["new_bytes"]
    with History(tmp_path / "h", mode="r") as h:  # close published v2
        assert [v.id for v in h.log()] == [v2, v1]
        assert h.load(v1)["u"].tobytes() == u.tobytes()
        assert h.load(v2)["u"].tobytes() == u2.tobytes()
    assert len(_packs(tmp_path)) == 2
    # v2's pack holds only the changed chunks (the first band) and its new scalar
    assert os.path.getsize(_packs(tmp_path)[0]) + os.path.getsize(_packs(tmp_path)[1]) < 2 * (
        u.nbytes
    )
    assert before > 0


def test_a_damaged_pack_entry_raises_corrupt_checkpoint_naming_the_pack(tmp_path, u):
    with _local(tmp_path) as h:
        vid = h.commit(_state(u))
    (pack,) = _packs(tmp_path)
    with open(pack, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as info:
            h.load(vid)
        assert info.value.path == pack and os.path.basename(pack) in str(info.value)
        report = h.verify()
        assert not report and [d.path for d in report.damaged] == [pack]


def _rewrite_index(pack: str, change) -> None:
    """Rewrite the pack's index with `change(records)` and a valid digest (a
    crafted pack: only the bounds checks can refuse it)."""
    data = bytearray(open(pack, "rb").read())
    count, at, _, end = struct.unpack("<QQ16s8s", data[-40:])
    records = [list(struct.unpack_from("<16sQQ16s", data, at + 48 * k)) for k in range(count)]
    change(records)
    index = b"".join(struct.pack("<16sQQ16s", *r) for r in records)
    tail = struct.pack("<QQ", count, at)
    digest = xxhash.xxh3_128_digest(bytes(data[:16]) + index + tail)
    data[at:] = index + tail + digest + end
    open(pack, "wb").write(bytes(data))


@pytest.mark.parametrize(
    "craft",
    [
        pytest.param(lambda r: r[0].__setitem__(1, 1 << 40), id="offset-beyond-the-file"),
        pytest.param(lambda r: r[0].__setitem__(2, 1 << 62), id="huge-length"),
    ],
)
def test_a_crafted_pack_index_is_refused_before_any_read_or_allocation(tmp_path, u, craft):
    with _local(tmp_path) as h:
        vid = h.commit(_state(u))
    (pack,) = _packs(tmp_path)
    _rewrite_index(pack, craft)
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as info:
            h.load(vid)
        assert info.value.path == pack and "outside its entries" in str(info.value)
        assert not h.verify()


def test_a_pack_whose_trailer_claims_a_huge_index_is_refused(tmp_path, u):
    with _local(tmp_path) as h:
        vid = h.commit(_state(u))
    (pack,) = _packs(tmp_path)
    data = bytearray(open(pack, "rb").read())
    data[-40:-32] = struct.pack("<Q", 1 << 50)  # the entry count
    open(pack, "wb").write(bytes(data))
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError, match="does not fit the file"):
            h.load(vid)
    data[-40:-32] = struct.pack("<Q", 0)
    data[-5] ^= 1  # the end magic
    open(pack, "wb").write(bytes(data))
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError, match="not a pack"):
            h.load(vid)


def test_gc_keeps_a_pack_while_a_kept_version_uses_one_of_its_chunks(tmp_path, u):
    with _local(tmp_path) as h:
        v1 = h.commit(_state(u), message="v1")
        v2 = h.commit(_state(u + 1.0, 2.0), message="v2")  # every chunk of u changed
        v3 = h.commit(_state(u, 3.0), message="v3")  # u as in v1: its chunks are v1's pack's
        h.wait()
        assert len(_packs(tmp_path)) == 2  # v3 wrote no chunk: no pack
        open(tmp_path / "h" / "scratch" / "p-1-deadbeef.pack", "wb").write(b"partial")
        report = h.gc(1)  # keeps v3 only
        assert set(report.removed) == {v1, v2}
        # v2's pack (no chunk v3 uses) is gone, v1's is kept; the partial pack was swept
        assert len(_packs(tmp_path)) == 1
        assert os.listdir(tmp_path / "h" / "scratch") == ["zarr.json"]
        assert h.load(v3)["u"].local.tobytes() == u.tobytes()
        assert h.verify()


def test_a_loose_commit_of_packed_chunks_keeps_its_zarr_view(tmp_path, u):
    zarr = pytest.importorskip("zarr")
    with _local(tmp_path) as h:
        h.commit(_state(u))
    with History(tmp_path / "h", chunk_bytes=4096) as h:
        vid = h.commit({"u": u}, message="serial")  # its chunks are in the pack already
        h.wait()
        assert h.verify()
    group = zarr.open_group(str(tmp_path / "h" / "versions" / vid), mode="r")
    assert np.asarray(group["0"][:]).tobytes() == u.tobytes()


def test_a_packed_version_exports_to_a_plain_zarr_copy(tmp_path, u):
    zarr = pytest.importorskip("zarr")
    with _local(tmp_path) as h:
        vid = h.commit(_state(u))
        h.wait()
        h.export(tmp_path / "x.tar")
    out = import_history(tmp_path / "x.tar", tmp_path / "copy")
    assert not os.path.exists(os.path.join(out, "packs"))
    group = zarr.open_group(os.path.join(out, "versions", vid), mode="r")
    assert np.asarray(group["0"][:]).tobytes() == u.tobytes()
    with History(out, mode="r") as h:
        assert h.load(vid)["u"].tobytes() == u.tobytes() and h.verify()


def test_a_failed_flush_raises_from_wait_and_adds_no_version(tmp_path, u):
    with _local(tmp_path) as h:
        v1 = h.commit(_state(u))
        h.wait()
        os.rename(tmp_path / "h" / "packs", tmp_path / "packs-away")
        open(tmp_path / "h" / "packs", "wb").close()  # a file where the packs directory was
        h.commit(_state(u + 1.0))
        with pytest.raises(AgreedError, match="flushing version"):
            h.wait()
        assert [v.id for v in h.log()] == [v1]
        os.unlink(tmp_path / "h" / "packs")
        os.rename(tmp_path / "packs-away", tmp_path / "h" / "packs")
        h.wait()  # nothing pending any more
        v3 = h.commit(_state(u + 2.0))
        h.wait()
        assert [v.id for v in h.log()] == [v3, v1]


def test_local_needs_a_communicator(tmp_path):
    from vlcc_adjoint.errors import VlccValueError

    with pytest.raises(VlccValueError, match="comm="):
        History(tmp_path / "h", local=tmp_path / "local")


def test_usage_counts_the_chunks_held_in_packs(tmp_path, u):
    with _local(tmp_path) as h:
        h.commit(_state(u))
        h.wait()
        usage = h.usage()
        assert usage.versions == 1 and usage.chunks > 1
        assert usage.chunk_bytes >= u.nbytes


def test_an_unusable_local_directory_fails_the_opening(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(AgreedError, match="node-local staging directory"):
        History(tmp_path / "h", comm=MPI.COMM_SELF, local=tmp_path / "file" / "sub")
    with History(tmp_path / "h", comm=MPI.COMM_SELF, local=tmp_path / "local") as h:
        assert len(h) == 0  # the repository was left usable


def _session(local, name: str, lock: bool) -> tuple:
    """A staging directory `name` in `local` as a session leaves it: a stage file
    and (with `lock`) its session.lock; returns the directory and, while the
    lock is held as a live leader holds it, the lock's descriptor."""
    d = local / name
    d.mkdir(parents=True)
    (d / "rank0.stage").write_bytes(b"\0" * 64)
    if not lock:
        return d, None
    fd = os.open(d / "session.lock", os.O_RDWR | os.O_CREAT, 0o644)
    return d, fd


def test_opening_sweeps_the_staging_directories_of_dead_sessions_only(tmp_path, u):
    local = tmp_path / "local"
    dead, fd = _session(local, "vlcc-00000000000000aa", lock=True)
    os.close(fd)  # its leader died: nobody holds the lock
    live, live_fd = _session(local, "vlcc-00000000000000bb", lock=True)
    fcntl.flock(live_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live leader's lock
    being_made, _ = _session(local, "vlcc-00000000000000cc", lock=False)
    other = local / "vlcc-notasession"
    other.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"1")
    (local / "vlcc-00000000000000dd").symlink_to(outside)  # a link, never followed
    try:
        with _local(tmp_path) as h:
            assert not dead.exists()  # swept
            assert live.exists() and being_made.exists() and other.exists()
            assert (outside / "keep").exists()
            # the session's own directory is locked while the History is open
            mine = [p for p in local.iterdir() if (p / "session.lock").exists() and p != live]
            assert len(mine) == 1
            probe = os.open(mine[0] / "session.lock", os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(probe)
            h.commit(_state(u))
            h.wait()
        assert not mine[0].exists()  # removed at close
    finally:
        os.close(live_fd)
    with _local(tmp_path) as h:  # the live session's leader has gone since
        assert not live.exists() and being_made.exists()
        assert len(h) == 1
