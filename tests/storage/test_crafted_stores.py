"""Crafted ZarrTier stores: links, FIFOs, size bombs, sparse huge metadata, object dtypes.

Each is refused (or listed as damaged) quickly, with bounded memory, and
nothing outside the store is read, written or deleted: a sentinel directory
next to the store is checked after every scenario.
"""

import hashlib
import os
import sys
import time
import tracemalloc

import numpy as np
import pytest

from vlcc_adjoint.state import flatten
from vlcc_adjoint.storage import CorruptCheckpointError, ZarrTier, make_record
from vlcc_adjoint.storage import format as F


def _record(step=1):
    leaves, spec = flatten({"lr": 0.25, "w": np.arange(6.0), "n": np.arange(3, dtype=np.int16)})
    spec["step"] = step
    return make_record(spec, leaves)


def _fingerprint(root):
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = b""
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    data = f.read()
            out.append(
                (p, st.st_mode, st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest())
            )
    return sorted(out)


@pytest.fixture
def world(tmp_path):
    """A store with one record ``r`` and a sentinel directory outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("do not touch")
    (outside / "sub").mkdir()
    (outside / "sub" / "zarr.json").write_text('{"zarr_format":3,"node_type":"group"}')
    store = tmp_path / "store"
    with ZarrTier(store) as tier:
        tier.put("r", _record())
    before = _fingerprint(outside)
    start = time.monotonic()
    tracemalloc.start()
    yield store, outside
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - start < 5, "a crafted store took too long to refuse"
    assert peak < 64 << 20, f"a crafted store made the reader allocate {peak} bytes"
    assert _fingerprint(outside) == before, "something outside the store changed"


def _refused(store, key="r", match=None, path=None, at_open=True):
    """Open (for reading and for writing); the record stays listed (as damaged when
    its description is what is wrong) and get raises naming the file."""
    for mode in ("r", "a"):
        with ZarrTier(store, mode=mode) as tier:
            assert key in tier.keys() and (key in tier.damaged()) == at_open
            with pytest.raises(CorruptCheckpointError, match=match) as info:
                tier.get(key)
            if path is not None:
                assert info.value.path == str(path)
    return tier


def _replace_by_link(path, target):
    os.rename(path, str(path) + ".real")
    os.symlink(target, path)


def test_a_linked_store_directory_is_refused(world, tmp_path):
    store, outside = world
    link = tmp_path / "link"
    os.symlink(store, link)
    for mode in ("r", "r+", "a", "w"):
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            ZarrTier(link, mode=mode)
    assert _record().checksums == ZarrTier(store, mode="r").get("r").checksums  # w emptied nothing


def test_a_linked_record_directory_is_listed_damaged_and_its_delete_unlinks_only_the_link(world):
    store, outside = world
    os.rename(store / "r", outside / "r")  # the record, moved out; its link planted instead
    os.symlink(outside / "r", store / "r")
    with ZarrTier(store) as tier:
        assert "r" in tier.damaged() and "symbolic link" in tier.damaged()["r"]
        tier.delete("r")
        assert list(tier.keys()) == [] and not os.path.lexists(store / "r")
    assert (outside / "r" / "zarr.json").exists()
    os.rename(outside / "r", store / "moved")  # restore the sentinel for the fixture's check
    import shutil

    shutil.rmtree(store / "moved")


def test_a_linked_leaf_directory_is_refused(world):
    store, outside = world
    _replace_by_link(store / "r" / "0", outside / "sub")
    _refused(store, match="symbolic link", path=store / "r" / "0")


@pytest.mark.parametrize("name", ["zarr.json", "0/c.0"])
def test_a_linked_metadata_or_chunk_file_is_refused(world, tmp_path, name):
    store, outside = world
    target = store / "r" / name
    copy = tmp_path / "copy"
    copy.write_bytes(target.read_bytes())  # the same bytes: only the link is wrong
    before = (copy.read_bytes(), os.stat(copy).st_mtime_ns)
    _replace_by_link(target, copy)
    _refused(store, match="symbolic link", path=target, at_open=name == "zarr.json")
    assert (copy.read_bytes(), os.stat(copy).st_mtime_ns) == before


def test_a_linked_root_metadata_lock_or_scratch_is_never_followed(world):
    store, outside = world
    root_meta = store / "zarr.json"
    (outside / "root.json").write_bytes(root_meta.read_bytes())
    _replace_by_link(root_meta, outside / "root.json")
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        ZarrTier(store, mode="r")
    os.unlink(root_meta)
    os.rename(str(root_meta) + ".real", root_meta)
    (outside / "root.json").unlink()
    # the lock: refused for writing (never written through), fine for reading
    lock = store / ".vlcc-lock" / "holder"
    os.unlink(lock)
    os.symlink(outside / "precious.txt", lock)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        ZarrTier(store)
    assert ZarrTier(store, mode="r").get("r").checksums == _record().checksums
    os.unlink(lock)
    os.rename(store / ".vlcc-lock", store / ".old-lock")
    os.symlink(outside, store / ".vlcc-lock")  # a linked lock directory
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        ZarrTier(store)
    os.unlink(store / ".vlcc-lock")
    # the scratch: a writer's cleanup removes the link, not what it points to
    os.rename(store / ".vlcc-scratch", store / ".old-scratch")
    os.symlink(outside, store / ".vlcc-scratch")
    with ZarrTier(store) as tier:
        tier.put("q", _record(2))
        tier.delete("q")
        assert not os.path.islink(store / ".vlcc-scratch")


@pytest.mark.parametrize("name", ["zarr.json", "0/c.0"])
def test_a_fifo_in_place_of_a_record_file_never_blocks(world, name):
    store, _ = world
    os.unlink(store / "r" / name)
    os.mkfifo(store / "r" / name)
    _refused(
        store, match="not a regular file", path=store / "r" / name, at_open=name == "zarr.json"
    )


def test_a_fifo_in_place_of_the_root_metadata_never_blocks(world):
    store, _ = world
    os.unlink(store / "zarr.json")
    os.mkfifo(store / "zarr.json")
    for mode in ("r", "a"):
        with pytest.raises(CorruptCheckpointError, match="not a regular file"):
            ZarrTier(store, mode=mode)


def _craft(store, key, leaves, fmt=2):
    """A record whose digest the crafter recomputed: only validation stands in the way."""
    attrs = {"format": fmt, "key": key, "spec": {"step": 1, "tree": {"leaf": 0}}, "leaves": leaves}
    doc, _ = F.sealed_group("vlcc_adjoint", attrs)
    os.makedirs(store / key / "0", exist_ok=True)
    (store / key / "zarr.json").write_bytes(doc)


@pytest.mark.parametrize(
    "leaf,match",
    [
        (
            {
                "dtype": "<f8",
                "shape": [1 << 40],
                "nbytes": 8 << 40,
                "chunk": "c.0",
                "checksum": "0" * 16,
            },
            "more than this machine",
        ),
        (
            {
                "dtype": "<f8",
                "shape": [1 << 20] * 8,
                "nbytes": 8,
                "chunk": "c.0.0.0.0.0.0.0.0",
                "checksum": "0" * 16,
            },
            "more than this machine",
        ),
        (
            {"dtype": "|O", "shape": [4], "nbytes": 32, "chunk": "c.0", "checksum": "0" * 16},
            "dtype",
        ),
        (
            {"dtype": "<f8", "shape": [-1], "nbytes": -8, "chunk": "c.0", "checksum": "0" * 16},
            "shape",
        ),
        (
            {
                "dtype": "<f8",
                "shape": [4],
                "nbytes": 32,
                "chunk": "../../outside/precious.txt",
                "checksum": "0" * 16,
            },
            "chunk",
        ),
    ],
)
def test_a_crafted_description_is_refused_before_anything_is_allocated(world, leaf, match):
    store, _ = world
    _craft(store, "bomb", [leaf])
    _refused(store, key="bomb", match=match, path=store / "bomb" / "zarr.json")


def test_a_chunk_file_of_the_wrong_size_is_refused_unread(world):
    store, _ = world
    chunk = store / "r" / "0" / "c.0"
    with open(chunk, "r+b") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB declared, nothing on disk
    with ZarrTier(store, mode="r") as tier:
        with pytest.raises(CorruptCheckpointError, match="bytes, its metadata says 48") as info:
            tier.get("r")
        assert info.value.path == str(chunk)


@pytest.mark.parametrize("name", ["r/zarr.json", "zarr.json"])
def test_sparse_huge_metadata_is_refused_unread(world, name):
    store, _ = world
    with open(store / name, "r+b") as f:
        f.truncate(8 << 30)
    if name == "zarr.json":
        with pytest.raises(CorruptCheckpointError, match="more than"):
            ZarrTier(store, mode="r")
    else:
        _refused(store, match="more than", path=store / name)


def test_opening_and_reading_a_store_imports_and_executes_nothing(world):
    store, outside = world
    marker = outside / "pwned"
    spec = {
        "step": 1,
        "tree": {"type": "os:system", "aux": f"touch {marker}", "items": [{"leaf": 0}]},
        "__reduce__": ["os.system", [f"touch {marker}"]],
    }
    attrs = {
        "format": 2,
        "key": "evil",
        "spec": spec,
        "leaves": [
            {
                "dtype": "<f8",
                "shape": [2],
                "nbytes": 16,
                "chunk": "c.0",
                "checksum": make_record({}, [np.zeros(2)]).checksums[0],
            }
        ],
    }
    doc, _ = F.sealed_group("vlcc_adjoint", attrs)
    os.makedirs(store / "evil" / "0")
    (store / "evil" / "zarr.json").write_bytes(doc)
    (store / "evil" / "0" / "c.0").write_bytes(np.zeros(2).tobytes())
    modules = set(sys.modules)
    with ZarrTier(store, mode="r") as tier:
        rec = tier.get("evil")  # a spec is data: returned, never interpreted here
    assert rec.spec == spec and set(sys.modules) == modules and not marker.exists()


def test_a_foreign_file_with_a_key_name_is_listed_damaged_and_deleted_only_inside(world):
    store, _ = world
    (store / "notes").write_text("a file where a record directory would be")
    with ZarrTier(store) as tier:
        assert "notes" in tier.damaged()
        with pytest.raises(CorruptCheckpointError, match="not a directory"):
            tier.get("notes")
        tier.delete("notes")
    assert not (store / "notes").exists()


def test_put_refuses_the_key_of_the_store_metadata(world):
    store, _ = world
    with ZarrTier(store) as tier:
        with pytest.raises(ValueError, match="zarr.json"):
            tier.put("zarr.json", _record())
        assert tier.get("r").checksums == _record().checksums
