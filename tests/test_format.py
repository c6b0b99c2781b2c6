"""The on-disk format's ground rules: safe opens, bounded reads, digests, the writer lock."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

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


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": NaN}', '{"a": 1, "a": 2}', '\xff\xfe'])
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
    same = json.loads(json.dumps({"checksums": ["ab" * 8],
                                  "spec": {"tree": {"w": {"leaf": 0}}, "lr": 0.25}}))
    assert F.digest(base) == F.digest(same)
    for changed in ({**base, "spec": {**base["spec"], "lr": 0.35}},
                    {**base, "spec": {**base["spec"], "tree": {"w": {"leaf": 1}}}},
                    {**base, "checksums": ["ac" * 8]}):
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
    code = ("import sys, time; from vlcc_adjoint.storage.format import WriterLock; "
            "l = WriterLock(sys.argv[1], 's'); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(F.StoreLockedError, match=f"process {proc.pid}"):
            F.WriterLock(path, "s")
    finally:
        proc.kill()
        proc.wait()
    F.WriterLock(path, "s").release()
