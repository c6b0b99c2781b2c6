"""The on-disk format's ground rules: safe opens, bounded reads, digests, the writer lock."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import vlcc_adjoint
from vlcc_adjoint.storage import CorruptCheckpointError
from vlcc_adjoint.storage import format as F


def test_open_regular_refuses_a_symlink_and_names_it(tmp_path):
    target = tmp_path / "outside.json"
    target.write_text("{}")
    link = tmp_path / "zarr.json"
    link.symlink_to(target)
    with pytest.raises(CorruptCheckpointError, match="symbolic link") as info:
        F.read_json(str(link))
    assert info.value.path == str(link)


def test_open_regular_refuses_a_fifo_without_hanging(tmp_path):
    fifo = tmp_path / "c.0"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match="not a regular file"):
        F.read_into(str(fifo), np.empty(8, np.uint8))
    assert time.monotonic() - start < 5


def test_check_dir_refuses_a_linked_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "versions").symlink_to(real)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        F.check_dir(str(tmp_path / "versions"))
    F.check_dir(str(real))  # a real directory passes
    (tmp_path / "file").write_text("x")
    with pytest.raises(CorruptCheckpointError, match="not a directory"):
        F.check_dir(str(tmp_path / "file"))


def test_read_json_refuses_a_sparse_huge_file_unread(tmp_path):
    path = tmp_path / "zarr.json"
    with open(path, "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB declared, nothing on disk
    with pytest.raises(CorruptCheckpointError, match="more than"):
        F.read_json(str(path))


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": NaN}', '{"a": 1, "a": 2}', "\xff\xfe"])
def test_read_json_names_the_file_of_any_malformed_document(tmp_path, text):
    path = tmp_path / "zarr.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(CorruptCheckpointError, match="zarr.json"):
        F.read_json(str(path))


def test_read_into_requires_the_declared_size(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(b"\x01" * 7)
    with pytest.raises(CorruptCheckpointError, match="7 bytes"):
        F.read_into(str(path), np.empty(8, np.uint8))
    out = np.empty(7, np.uint8)
    F.read_into(str(path), out)
    assert (out == 1).all()


def test_digest_changes_with_any_value_and_not_with_key_order():
    base = {"spec": {"lr": 0.25, "tree": {"w": {"leaf": 0}}}, "checksums": ["ab" * 8]}
    same = json.loads(
        json.dumps({"checksums": ["ab" * 8], "spec": {"tree": {"w": {"leaf": 0}}, "lr": 0.25}})
    )
    assert F.digest(base) == F.digest(same)
    for changed in (
        {**base, "spec": {**base["spec"], "lr": 0.35}},
        {**base, "spec": {**base["spec"], "tree": {"w": {"leaf": 1}}}},
        {**base, "checksums": ["ac" * 8]},
    ):
        assert F.digest(changed) != F.digest(base)


def test_check_allocation_refuses_more_than_the_machine_has(tmp_path):
    assert F.check_allocation(1024, "x") == 1024
    with pytest.raises(CorruptCheckpointError, match="more than this machine"):
        F.check_allocation(F.allocation_limit() + 1, "x")
    with pytest.raises(CorruptCheckpointError):
        F.check_allocation(-1, "x")


def test_parse_mode_lists_the_modes():
    assert F.parse_mode("r+") == "r+"
    with pytest.raises(ValueError, match="'w-'"):
        F.parse_mode("rw")


def test_writer_lock_excludes_a_second_writer_and_names_the_holder(tmp_path):
    lock = F.WriterLock(str(tmp_path / ".lock"), "the store")
    with pytest.raises(F.StoreLockedError, match=f"process {os.getpid()}"):
        F.WriterLock(str(tmp_path / ".lock"), "the store")
    lock.release()
    F.WriterLock(str(tmp_path / ".lock"), "the store").release()  # free again


def test_writer_lock_of_a_killed_holder_is_free(tmp_path):
    path = str(tmp_path / ".lock")
    code = (
        "import sys, time; from vlcc_adjoint.storage.format import WriterLock; "
        "l = WriterLock(sys.argv[1], 's'); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(F.StoreLockedError, match=f"process {proc.pid}"):
            F.WriterLock(path, "s")
    finally:
        proc.kill()
        proc.wait()
    F.WriterLock(path, "s").release()


# -- what the zarr tier and the MPI tier share -------------------------------------


def test_sealed_group_json_writes_the_bytes_of_sealed_group_and_unseal_checks_them():
    attrs = {
        "format": 2,
        "key": "u3",
        "leaves": [{"checksum": "ab" * 8, "shape": [2]}],
        "spec": {"lr": 0.25, "name": "adam", "tree": {"leaf": 0}},
    }
    doc, d = F.sealed_group("vlcc_adjoint", attrs)
    parts = {k: F.canonical_json(v) for k, v in attrs.items()}
    assert F.sealed_group_json("vlcc_adjoint", parts) == (doc, d)
    parsed = json.loads(doc)
    assert F.canonical_json(parsed) == doc  # the file is canonical JSON
    assert F.unseal(parsed["attributes"]["vlcc_adjoint"], "p") == attrs
    tampered = dict(parsed["attributes"]["vlcc_adjoint"], spec={**attrs["spec"], "lr": 0.35})
    with pytest.raises(CorruptCheckpointError, match="digest") as info:
        F.unseal(tampered, "the/file")
    assert info.value.path == "the/file"
    with pytest.raises(ValueError, match="digest"):
        F.sealed_group_json("vlcc_adjoint", {"checksum": b"1"})  # sorts before "digest"


def test_array_metadata_is_zarr_v3_with_byte_order_and_raw_bytes_for_other_dtypes():
    meta, chunk = F.array_metadata(np.dtype(">i4"), (3, 2))
    doc = json.loads(meta)
    assert (
        doc["data_type"] == "int32"
        and doc["codecs"] == [{"name": "bytes", "configuration": {"endian": "big"}}]
        and chunk == "c.0.0"
    )
    meta, chunk = F.array_metadata(np.dtype("M8[s]"), (4,))
    assert json.loads(meta)["shape"] == [4, 8] and chunk == "c.0.0"
    meta, _ = F.array_metadata(np.dtype("<f4"), (10, 6), chunk_shape=(5, 3))
    assert json.loads(meta)["chunk_grid"]["configuration"]["chunk_shape"] == [5, 3]
    assert F.array_metadata(np.dtype("<f8"), (0, 3))[1] is None
    assert F.chunk_key(()) == "c" and F.chunk_key((1, 2)) == "c.1.2"


def test_check_leaf_refuses_objects_bad_shapes_and_sizes_beyond_memory():
    assert F.check_leaf("<f8", [2, 3], "p") == (np.dtype("<f8"), (2, 3), 48)
    for dtype, shape, match in (
        ("|O", [1], "dtype"),
        ("<f8", [-1], "shape"),
        ("<f8", [2.0], "shape"),
        ("<f8", [1 << 40] * 2, "more than"),
        ({"descr": [["a", "|O"]]}, [1], "dtype"),
    ):
        with pytest.raises(CorruptCheckpointError, match=match):
            F.check_leaf(dtype, shape, "p")


def test_remove_tree_stays_inside_the_root_and_never_follows_links(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("x")
    (root / "d").mkdir()
    (root / "d" / "link").symlink_to(outside)
    (root / "top").symlink_to(outside)
    F.remove_tree(str(root / "top"), str(root))
    F.remove_tree(str(root / "d"), str(root))
    assert (outside / "keep").read_text() == "x" and os.listdir(root) == []
    for bad in (tmp_path / "outside", root, root / ".." / "outside"):
        with pytest.raises(ValueError, match="not inside"):
            F.remove_tree(str(bad), str(root))
    assert (outside / "keep").exists()


def test_writes_never_follow_a_planted_link(tmp_path, monkeypatch):
    (tmp_path / "outside").write_text("precious")
    F.write_group(str(tmp_path / "zarr.json"), {"a": 1}, durable=False)
    assert json.loads((tmp_path / "zarr.json").read_text())["attributes"] == {"a": 1}
    # A link planted at the scratch name is refused (created exclusively, never followed) ...
    planted = tmp_path / ".zarr.json.planted.tmp"
    planted.symlink_to(tmp_path / "outside")
    monkeypatch.setattr(F, "scratch_name", lambda path: str(planted))
    with pytest.raises(FileExistsError):
        F.write_atomic(str(tmp_path / "zarr.json"), b"overwritten", durable=False)
    assert (tmp_path / "outside").read_text() == "precious"
    assert json.loads((tmp_path / "zarr.json").read_text())["attributes"] == {"a": 1}
    # ... and so is one at the file itself.
    (tmp_path / "c.0").symlink_to(tmp_path / "outside")
    with pytest.raises(OSError):
        F.write_file(str(tmp_path / "c.0"), b"overwritten", False)
    assert (tmp_path / "outside").read_text() == "precious"


def test_write_atomic_replaces_whole_and_leaves_no_scratch_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "zarr.json"
    F.write_atomic(str(path), b"old", durable=True)
    st = F.write_atomic(str(path), b"new!", durable=False)
    assert path.read_bytes() == b"new!" and st.st_ino == os.stat(path).st_ino
    assert os.listdir(tmp_path) == ["zarr.json"]

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", no_rename)
    with pytest.raises(OSError):
        F.write_atomic(str(path), b"lost", durable=False)
    assert path.read_bytes() == b"new!" and os.listdir(tmp_path) == ["zarr.json"]


def test_create_file_keeps_the_first_content(tmp_path):
    path = str(tmp_path / "zarr.json")
    F.create_file(path, b"first", durable=False)
    F.create_file(path, b"second", durable=True)
    assert open(path, "rb").read() == b"first" and os.listdir(tmp_path) == ["zarr.json"]


def test_strict_json_and_groups_of_the_one_format_layer(tmp_path):
    assert F.parse_json(b'{"a": [1, 2.5, "x"]}', "p") == {"a": [1, 2.5, "x"]}
    for bad in (b'{"a": Infinity}', b'{"a": 1, "a": 1}', b"[" * 100_000, b"\xff"):
        with pytest.raises(CorruptCheckpointError, match="the/file"):
            F.parse_json(bad, "the/file")
    path = str(tmp_path / "zarr.json")
    F.write_group(path, {"vlcc_adjoint": {"format": 2}, "other": 1}, durable=False)
    assert F.open_group(path, "vlcc_adjoint") == {"format": 2}
    assert F.open_group(path, "missing") is None  # a foreign node: not ours, not damaged
    meta, _ = F.array_metadata(np.dtype("<f8"), (3,))
    open(path, "wb").write(meta)
    assert F.open_group(path, "x", group=False) is None
    with pytest.raises(CorruptCheckpointError, match="zarr v3 group"):
        F.open_group(path, "x")


def test_sealed_text_group_checks_the_bytes_it_was_written_with():
    text = b'{"format":2,"nodes":[1,2,3]}'
    raw = F.sealed_text_group("g", text)
    assert json.loads(raw)["attributes"]["g"] == {"format": 2, "nodes": [1, 2, 3]}
    assert F.open_sealed_text_group(raw, "g", "p") == {"format": 2, "nodes": [1, 2, 3]}
    assert F.open_sealed_text_group(b'{"zarr_format":3}', "g", "p") is None  # no seal
    damaged = raw.replace(b"[1,2,3]", b"[1,2,4]")
    with pytest.raises(CorruptCheckpointError, match="seal") as info:
        F.open_sealed_text_group(damaged, "g", "the/graph")
    assert info.value.path == "the/graph"


def test_seal_and_unseal_with_an_expected_digest():
    sealed = F.seal({"a": 1, "digest": "stale"})
    assert F.unseal(sealed, "p") == {"a": 1}
    assert F.unseal(sealed, "p", expected=sealed["digest"]) == {"a": 1}
    with pytest.raises(CorruptCheckpointError, match="recorded for it elsewhere"):
        F.unseal(sealed, "p", "the manifest", expected="0" * 32)
    with pytest.raises(CorruptCheckpointError, match="no valid digest"):
        F.unseal({"a": 1, "digest": "xyz"}, "p")


_WITHOUT_ZARR = """
import sys
sys.modules["zarr"] = None  # `import zarr` raises ImportError, as when it is not installed
import numpy as np
import vlcc_adjoint
from vlcc_adjoint.lineage import History
from vlcc_adjoint.state import flatten
from vlcc_adjoint.storage import TieredStore, ZarrTier, make_record

root = sys.argv[1]
tier = ZarrTier(root + "/z")
leaves, spec = flatten({"u": np.arange(6.0), "t": 0.5})
tier.put("a", make_record(spec, leaves))
assert np.array_equal(tier.get("a").leaves[0], np.arange(6.0))
tier.close()
with TieredStore([ZarrTier(root + "/s")]) as store:
    store.save(3, {"u": np.ones(4)})
    assert store.load(3)["u"].sum() == 4
with History(root + "/h") as h:
    vid = h.commit({"u": np.arange(5)})
    assert list(h.checkout(vid)["u"]) == [0, 1, 2, 3, 4]
assert sys.modules["zarr"] is None
print("ok")
"""


def test_the_package_imports_and_runs_without_zarr(tmp_path):
    """zarr-python is a test dependency only: every store is written and read by
    vlcc_adjoint.storage.format."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ZARR, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(vlcc_adjoint.__file__))},
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
