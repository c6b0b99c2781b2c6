"""The MPI tier's hierarchy on the shared format: the record digest, damaged records
listed, crafted files refused, format-1 records still read, one writer (one rank,
in process: no mpiexec needed)."""

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from mpi4py import MPI  # noqa: E402

from vlcc_adjoint.mpi import (  # noqa: E402
    Decomposition,
    DistributedArray,
    SharedZarrTier,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from vlcc_adjoint.storage import CorruptCheckpointError  # noqa: E402

COMM = MPI.COMM_SELF


def _state():
    d = Decomposition.split((12, 5), (1, 1))
    return {
        "u": DistributedArray(np.arange(60.0).reshape(12, 5), d, 0),
        "lr": 0.25,
        "name": "wave",
        "levels": np.arange(4, dtype=np.int16),
    }


def _check(state):
    np.testing.assert_array_equal(state["u"].local, np.arange(60.0).reshape(12, 5))
    assert state["lr"] == 0.25 and state["name"] == "wave"
    assert state["levels"].dtype == np.int16 and list(state["levels"]) == [0, 1, 2, 3]


@pytest.fixture
def hierarchy(tmp_path):
    path = tmp_path / "h"
    name = write_checkpoint(path, _state(), COMM, step=7)
    return path, name


def test_a_written_record_is_sealed_and_reads_back(hierarchy):
    path, name = hierarchy
    _check(read_checkpoint(path, name))
    attrs = json.loads((path / name / "zarr.json").read_bytes())["attributes"]["vlcc_adjoint"]
    assert attrs["format"] == 2 and len(attrs["digest"]) == 32
    (rec,) = list_checkpoints(path)
    assert rec["step"] == 7 and rec["damaged"] is None


@pytest.mark.parametrize(
    "old,new", [(b"0.25", b"0.35"), (b'"wave"', b'"wavy"'), (b'"leaf":1', b'"leaf":2')]
)
def test_an_edited_record_description_is_reported_and_still_listed(hierarchy, old, new):
    path, name = hierarchy
    meta = path / name / "zarr.json"
    data = meta.read_bytes()
    assert old in data
    meta.write_bytes(data.replace(old, new, 1))
    with pytest.raises(CorruptCheckpointError, match="digest") as info:
        read_checkpoint(path, name)
    assert info.value.path == str(meta)
    (rec,) = list_checkpoints(path)
    assert rec["name"] == name and "digest" in rec["damaged"]


def test_flipping_any_byte_of_the_record_metadata_or_checksums_never_returns_wrong_data(hierarchy):
    path, name = hierarchy
    files = [path / name / "zarr.json", path / name / "xxh3" / "0" / "c.0.0"]
    outcomes = {"equal": 0, "corrupt": 0}
    for f in files:
        original = f.read_bytes()
        for pos in range(len(original)):
            damaged = bytearray(original)
            damaged[pos] ^= 0x01
            f.write_bytes(damaged)
            try:
                state = read_checkpoint(path, name)
            except CorruptCheckpointError as err:
                assert err.path in {str(f), str(path / name / "0" / "c.0.0")}, (f, pos, err)
                outcomes["corrupt"] += 1
            else:
                _check(state)
                outcomes["equal"] += 1
            assert [r["name"] for r in list_checkpoints(path)] == [name]  # never vanishes
        f.write_bytes(original)
    assert outcomes["corrupt"] > 0
    _check(read_checkpoint(path, name))


def test_a_format_1_record_still_reads(hierarchy):
    path, name = hierarchy
    meta = path / name / "zarr.json"
    doc = json.loads(meta.read_bytes())
    attrs = doc["attributes"]["vlcc_adjoint"]
    del attrs["digest"]
    attrs["format"] = 1
    for leaf in attrs["leaves"]:
        leaf.pop("checksums_xxh3", None)
    meta.write_text(json.dumps(doc))  # what the format-1 writer wrote
    _check(read_checkpoint(path, name))
    attrs["digest"] = "0" * 32  # a format-2 record relabelled format 1 is refused
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpointError, match="format-1 record"):
        read_checkpoint(path, name)


@pytest.mark.parametrize("kind", ["link", "fifo", "size"])
def test_a_crafted_chunk_file_is_refused_quickly(hierarchy, tmp_path, kind):
    path, name = hierarchy
    chunk = path / name / "0" / "c.0.0"
    if kind == "link":
        copy = tmp_path / "copy"
        copy.write_bytes(chunk.read_bytes())
        chunk.unlink()
        chunk.symlink_to(copy)
        match = "symbolic link"
    elif kind == "fifo":
        chunk.unlink()
        os.mkfifo(chunk)
        match = "not a regular file"
    else:
        with open(chunk, "r+b") as f:
            f.truncate(8 << 30)
        match = "bytes"
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match=match) as info:
        read_checkpoint(path, name)
    assert time.monotonic() - start < 5 and info.value.path == str(chunk)


def test_a_linked_record_directory_is_listed_damaged(hierarchy, tmp_path):
    path, name = hierarchy
    os.rename(path / name, tmp_path / "moved")
    os.symlink(tmp_path / "moved", path / name)
    (rec,) = list_checkpoints(path)
    assert "symbolic link" in rec["damaged"]
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        read_checkpoint(path, name)


def test_a_second_writer_of_a_hierarchy_is_refused_naming_the_holder(tmp_path):
    first = SharedZarrTier(tmp_path / "h", COMM)
    pending = tmp_path / "h" / ".vlcc-pending" / "in-flight"
    pending.mkdir()
    # every rank raises the same AgreedError, which carries rank 0's StoreLockedError
    with pytest.raises(
        Exception,
        match=f"StoreLockedError.*open for writing by process {os.getpid()}.*read_checkpoint",
    ):
        SharedZarrTier(tmp_path / "h", COMM)
    assert pending.exists()  # the refused opener removed nothing
    first.close()
    SharedZarrTier(tmp_path / "h", COMM).close()
    assert not pending.exists()


def _zarr_reads_every_committed_record(path):
    """Every committed record of the hierarchy at `path`, through plain zarr, equals
    what read_checkpoint returns (global arrays; raw bytes for other dtypes)."""
    zarr = pytest.importorskip("zarr")
    from vlcc_adjoint.state import flatten

    root = zarr.open_group(str(path), mode="r")
    records = list_checkpoints(path)
    assert records and all(r["damaged"] is None for r in records)
    for rec in records:
        group = root[rec["name"]]
        leaves, _ = flatten(read_checkpoint(path, rec["name"]))
        for i, leaf in enumerate(leaves):
            got = np.ascontiguousarray(group[str(i)][...])
            if got.dtype == np.uint8 and leaf.dtype != np.uint8:  # raw bytes of other dtypes
                got = got.view(leaf.dtype).reshape(leaf.shape)
            assert got.shape == leaf.shape and got.tobytes() == leaf.astype(got.dtype).tobytes()
    return records


def test_plain_zarr_reads_a_hierarchy_written_serially(tmp_path):
    """write_checkpoint and a DistributedStore's commits in one process (COMM_SELF)
    write a hierarchy that plain zarr opens, with the same arrays."""
    from vlcc_adjoint.mpi import DistributedStore
    from vlcc_adjoint.storage import MemoryTier

    path = tmp_path / "h"
    write_checkpoint(path, dict(_state(), when=np.array(["2024-05-06"], "M8[D]")), COMM, step=7)
    d = Decomposition.split((9, 4), (1, 1))
    with DistributedStore(COMM, [MemoryTier(), SharedZarrTier(path, COMM)], commit_every=2) as s:
        for step in range(5):
            u = np.arange(36.0).reshape(9, 4) * step
            s.save(step, {"u": DistributedArray(u, d, 0), "t": float(step)}, level=1)
        s.delete(1, 1)
    records = _zarr_reads_every_committed_record(path)
    assert sorted(r["step"] for r in records) == [0, 2, 3, 4, 7]
