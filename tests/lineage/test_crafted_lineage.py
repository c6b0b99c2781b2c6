"""Crafted lineage repositories: links, FIFOs, size bombs, sparse metadata, foreign dtypes.

Each attack runs in a child process (so a hang is a timeout, not a stuck test suite) with
its address space limited (so an allocation bomb is a refusal, not a swapping machine),
and must be refused within 5 s with a CorruptCheckpointError or StorageError, while a
sentinel directory outside the repository stays exactly as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_lineage_integrity import edit_manifest, manifest_path

from vlcc_adjoint.lineage import History
from vlcc_adjoint.storage.codecs import Lossless

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    repo, mode, action, extra = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    import numpy as np
    from vlcc_adjoint.lineage import History
    if extra:  # bound the address space: what is mapped now plus `extra` bytes
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, mapped + extra))
    t0 = time.monotonic()
    out = {"error": None}
    try:
        with History(repo, mode=mode, chunk_bytes=256) as h:
            if action == "load":
                for v in h.log(all=True):
                    h.load(v.id)
            elif action == "diff":
                vs = h.log(all=True)  # the first two versions differ in every chunk of x
                h.diff(vs[-1].id, vs[-2].id)
            elif action == "gc":
                h.gc(keep=1)
            elif action == "commit":
                # the fixture's first state: its chunks are (said to be) stored already
                h.commit({"x": np.arange(100.0), "n": np.arange(7, dtype=np.int16)},
                         branch="main")
                h.wait()
    except Exception as err:
        out = {"error": type(err).__name__, "message": str(err),
               "path": getattr(err, "path", None), "modules": sorted(sys.modules)}
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out))
""")


def attack(repo, action="load", mode="a", memory=1 << 30, extra_path=None):
    """Run `action` on `repo` in a child process; its outcome (error class, message, path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, extra_path, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(repo), mode, action, str(memory)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["seconds"] < 5, out
    return out


def refused(out, path=None):
    assert out["error"] in ("CorruptCheckpointError", "StorageError"), out
    if path is not None:
        assert str(path) in out["message"], out
    return out


def snapshot(directory):
    """Every entry under `directory` with its kind, size, mtime and content."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.lstat(p)
            data = open(p, "rb").read() if os.path.isfile(p) and not os.path.islink(p) else None
            out[os.path.relpath(p, directory)] = (st.st_mode, st.st_size, st.st_mtime_ns, data)
    return out


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "h"
    with History(path, chunk_bytes=256) as h:
        h.commit({"x": np.arange(100.0), "n": np.arange(7, dtype=np.int16)}, meta={"step": 1})
        h.commit({"x": np.arange(100.0) + 1, "n": np.arange(7, dtype=np.int16)}, meta={"step": 2})
        h.commit({"x": np.zeros(3)}, branch="exp")
    return path


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    (d / "sub").mkdir(parents=True)
    (d / "precious.txt").write_text("keep me")
    (d / "sub" / "data.bin").write_bytes(b"\x01" * 100)
    return d


def _chunk_of(repo, vid=None):
    with History(repo, mode="r") as h:
        vid = vid or h.log(all=True)[-1].id
        return vid, h._reader.manifest(vid).leaves[0][2][0]


# -- links --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["scratch", "versions", "chunks", "graph", "locks"])
@pytest.mark.parametrize("action", ["gc", "commit", "load"])
def test_a_linked_top_level_directory_is_refused_and_nothing_outside_is_touched(
    repo, outside, name, action
):
    real = outside / f"{name}-real"
    shutil.move(repo / name, real)
    (real / "precious_dir").mkdir()
    (real / "precious_dir" / "f").write_text("x")
    (repo / name).symlink_to(real, target_is_directory=True)
    before = snapshot(outside)
    refused(attack(repo, action), repo / name)
    if action == "load":  # a reader refuses too, or never goes there (scratch/)
        out = attack(repo, "load", mode="r")
        assert out["error"] is None if name == "scratch" else refused(out, repo / name)
    assert snapshot(outside) == before


@pytest.mark.parametrize("which", ["root", "graph", "manifest", "chunk", "lock"])
def test_a_linked_file_is_refused_not_followed(repo, outside, which):
    vid, addr = _chunk_of(repo)
    path = {
        "root": repo / "zarr.json",
        "graph": repo / "graph" / "zarr.json",
        "manifest": manifest_path(repo, vid),
        "chunk": repo / "chunks" / addr[:2] / addr[2:],
        "lock": repo / "locks" / "graph.lock",
    }[which]
    target = outside / "target"
    if which == "lock":
        path.unlink()  # a link to where no file is yet: following it would create one
    else:
        shutil.move(path, target)  # the right content, through a link
    path.symlink_to(target)
    before = snapshot(outside)
    for mode in ("a", "r"):
        out = attack(repo, "load", mode=mode)
        if which == "lock" and mode == "r":
            assert out["error"] is None or refused(out, path)  # a reader takes no lock
        else:
            refused(out, path)
    assert snapshot(outside) == before


def test_a_linked_chunk_directory_is_refused(repo, outside):
    vid, addr = _chunk_of(repo)
    sub = repo / "chunks" / addr[:2]
    shutil.move(sub, outside / "sub2")
    sub.symlink_to(outside / "sub2", target_is_directory=True)
    before = snapshot(outside)
    refused(attack(repo, "load"), sub)
    refused(attack(repo, "commit"))
    assert snapshot(outside) == before


# -- FIFOs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["root", "graph", "manifest", "chunk", "lock"])
def test_a_fifo_in_place_of_a_file_is_refused_without_waiting(repo, which):
    vid, addr = _chunk_of(repo)
    path = {
        "root": repo / "zarr.json",
        "graph": repo / "graph" / "zarr.json",
        "manifest": manifest_path(repo, vid),
        "chunk": repo / "chunks" / addr[:2] / addr[2:],
        "lock": repo / "locks" / "gc.lock",
    }[which]
    path.unlink()
    os.mkfifo(path)
    refused(attack(repo, "load"), path)
    if which != "lock":
        refused(attack(repo, "load", mode="r"), path)


# -- size bombs ----------------------------------------------------------------------------


def test_a_manifest_pointing_many_times_at_one_zero_chunk_is_refused_before_allocating(tmp_path):
    """1 MiB of zeros compresses to a few hundred bytes; 6144 references to it declare 6 GiB."""
    repo = tmp_path / "h"
    with History(repo, codec=Lossless()) as h:
        vid = h.commit({"x": np.zeros(1 << 17)})
    size = sum(f.stat().st_size for f in repo.rglob("*") if f.is_file())
    assert size < 64 << 10

    def bomb(attrs):
        leaf = attrs["leaves"][0]
        n = 6144 * (1 << 17)
        leaf["shape"] = [n]
        leaf["nbytes"] = 8 * n
        leaf["chunks"] = leaf["chunks"] * 6144
        attrs["spec"]["leaves"][0]["shape"] = [n]

    edit_manifest(repo, vid, bomb, reseal=True)
    out = refused(attack(repo, "load", memory=1 << 30))
    assert vid in out["message"] and str(6144 << 20) in out["message"]
    assert "bytes this process may allocate" in out["message"]


def test_a_declared_size_beyond_the_machines_memory_is_corrupt(tmp_path):
    repo = tmp_path / "h"
    with History(repo) as h:
        vid = h.commit({"x": np.zeros(16)})

    def huge(attrs):
        leaf = attrs["leaves"][0]
        n = 1 << 44  # 128 TiB of float64 in 2**15 chunks of 4 GiB
        leaf["shape"], leaf["chunk_shape"] = [n], [1 << 29]
        leaf["chunks"] = leaf["chunks"] * (n >> 29)
        attrs["spec"]["leaves"][0]["shape"] = [n]

    edit_manifest(repo, vid, huge, reseal=True)
    out = refused(attack(repo, "load"), manifest_path(repo, vid))
    assert out["error"] == "CorruptCheckpointError"


def test_a_chunk_file_larger_than_declared_is_refused_unread(repo):
    vid, addr = _chunk_of(repo)
    path = repo / "chunks" / addr[:2] / addr[2:]
    os.truncate(path, 8 << 30)  # sparse: costs no disk
    refused(attack(repo, "load", memory=256 << 20), path)
    refused(attack(repo, "diff", memory=256 << 20), path)


@pytest.mark.parametrize("which", ["root", "graph", "manifest"])
def test_sparse_huge_metadata_is_refused_unread(repo, which):
    vid, _ = _chunk_of(repo)
    path = {
        "root": repo / "zarr.json",
        "graph": repo / "graph" / "zarr.json",
        "manifest": manifest_path(repo, vid),
    }[which]
    os.truncate(path, 8 << 30)
    refused(attack(repo, "load", memory=256 << 20), path)


# -- dtypes, types -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["|O", "|O8", "<O", {"descr": [["a", "|O"]]}, "object"])
def test_object_dtypes_are_refused_even_when_sealed(repo, dtype):
    vid, _ = _chunk_of(repo)

    def objects(attrs):
        attrs["leaves"][0]["dtype"] = dtype
        attrs["spec"]["leaves"][0]["dtype"] = dtype

    edit_manifest(repo, vid, objects, reseal=True)
    out = refused(attack(repo, "load"), manifest_path(repo, vid))
    assert out["error"] == "CorruptCheckpointError"


def test_loading_imports_and_executes_nothing(repo, tmp_path):
    """A spec naming a type of a module on the path: the load refuses, the module is not
    imported (importing it would write a file)."""
    vid, _ = _chunk_of(repo)
    mods = tmp_path / "mods"
    mods.mkdir()
    flag = tmp_path / "imported"
    (mods / "evil_lineage_mod.py").write_text(
        f"open({str(flag)!r}, 'w').write('ran')\nclass Thing:\n    pass\n"
    )

    def typed(attrs):
        tree = attrs["spec"]["tree"]
        tree["items"][0] = {
            "type": "evil_lineage_mod:Thing",
            "aux": ["x"],
            "items": [tree["items"][0]],
        }

    edit_manifest(repo, vid, typed, reseal=True)
    out = attack(repo, "load", extra_path=str(mods))
    assert out["error"] == "UnknownStateTypeError", out
    assert "evil_lineage_mod" not in out["modules"] and not flag.exists()


@pytest.mark.parametrize("which", ["chunk", "version file", "missing chunk"])
def test_export_refuses_links_and_leaves_no_partial_archive(repo, outside, which):
    from vlcc_adjoint.lineage import CorruptCheckpointError, export_history

    vid, addr = _chunk_of(repo)
    path = (
        repo / "chunks" / addr[:2] / addr[2:]
        if which != "version file"
        else repo / "versions" / vid / "0" / "zarr.json"
    )
    if which == "missing chunk":
        path.unlink()
    else:
        shutil.move(path, outside / "target")
        path.symlink_to(outside / "target")
    out = repo.parent / "out.tar"
    with pytest.raises(CorruptCheckpointError) as err:
        export_history(repo, out)
    assert err.value.path == str(path) and not out.exists()
