"""History(path, comm=comm, local=dir): the node-local tier under mpiexec.

Commits staged in a node-local directory and flushed as one pack per node
load bitwise on other rank counts and serially; a rank killed during a
flush makes every other rank exit within 60 s, and a restart on fewer ranks
sees exactly the versions published before, each readable (nothing partial).
The scripts are ``mpi_scripts/lineage_mpi.py``'s (``local=DIR``, ``crash``,
``newest``).  Packs themselves (damage, crafted indexes, gc) are tested in
one process in tests/lineage/test_lineage_packs.py.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from test_lineage_mpi import SCRIPT, _commit, _lines
from test_mpi import MPIEXEC, _mpiexec, _ok, needs_mpi

from vlcc_adjoint.lineage import History

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SCRIPT.parent))

pytestmark = needs_mpi


@pytest.mark.parametrize("ranks", [2, 4])
def test_local_commits_flush_one_pack_per_node_and_load_bitwise_on_other_counts(tmp_path, ranks):
    from lineage_mpi import fields

    path, local = tmp_path / "h", tmp_path / "local"
    out = _commit(path, ranks, f"local={local}")
    ids = out["ids"]
    # one node here: one pack per version that wrote chunks; no loose chunk file
    packs = glob.glob(str(path / "packs" / "*.pack"))
    assert 1 <= len(packs) <= 3
    assert glob.glob(str(path / "chunks" / "*" / "*")) == []
    for vid in ids.values():
        assert os.listdir(path / "versions" / vid) == ["zarr.json"]
    assert os.listdir(local) == []  # every staging directory removed by close
    for q in {3, 1} - {ranks}:
        proc, _ = _mpiexec(q, SCRIPT, "load", path)
        assert [r["verified"] for r in _lines(proc)] == [["v1", "v2", "v3"]] * q
    with History(path, mode="r") as h:
        for version, vid in ids.items():
            state = h.load(vid)
            for key, arr in fields(version).items():
                assert state[key].tobytes() == arr.tobytes()
        assert h.verify()


def test_a_rank_killed_during_a_flush_ends_every_rank_and_nothing_partial_is_visible(tmp_path):
    path, local = tmp_path / "h", tmp_path / "local"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    t0 = time.monotonic()
    # -disable-auto-cleanup: mpiexec may let the survivors run on after the kill,
    # and then what ends them is the History's own timeout (15 s in the script)
    proc = subprocess.run(
        [MPIEXEC, "-disable-auto-cleanup", "-n", "3", sys.executable, str(SCRIPT), "crash"]
        + [str(path), f"local={local}"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0 and elapsed < 60, (elapsed, proc.stdout[-2000:])
    # MPICH's mpiexec usually ends the survivors itself within seconds (its
    # message names the killed rank); a survivor that got to its timeout first
    # left its error: the History's timeout, naming the flush it waited for.
    assert (
        "BAD TERMINATION" in proc.stdout
        or "Killed" in proc.stdout
        or glob.glob(f"{path}.crash*.json")
    ), proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in glob.glob(f"{path}.crash*.json"):
        with open(name) as f:
            report = json.load(f)
        assert report["error"].startswith("CollectiveTimeoutError"), report
        assert "while flushing version" in report["error"] and report["after"] < 30, report
    # a restart on fewer ranks sees v1 only, readable; gc sweeps what v2 left
    proc, _ = _mpiexec(2, SCRIPT, "newest", path)
    assert [r["newest"] for r in _lines(proc)] == ["v1", "v1"]
    assert [r["versions"] for r in _lines(proc)] == [1, 1]
    with History(path) as h:
        assert [v.message for v in h.log(all=True)] == ["v1"]
        h.gc()
        assert h.verify()
        assert len(glob.glob(str(path / "packs" / "*.pack"))) == 1
        assert os.listdir(path / "scratch") == ["zarr.json"]
        np.testing.assert_equal(h.load("HEAD")["t"], 1.0)
    _ok(proc)


def test_a_failing_rank_fails_a_local_commit_on_every_rank_and_adds_nothing(tmp_path):
    proc, _ = _mpiexec(2, SCRIPT, "fail", tmp_path / "h", f"local={tmp_path / 'local'}")
    ranks = _lines(proc)
    assert len(ranks) == 2 and all(r["versions"] == 0 for r in ranks)
    assert ranks[0]["failed"] == ranks[1]["failed"] and "rank 1 failed" in ranks[0]["failed"]


def test_two_nodes_flush_one_pack_each_and_rank_0_publishes_both(tmp_path):
    path = tmp_path / "h"
    out = _commit(path, 4, f"local={tmp_path / 'local'}", "two-nodes")
    with History(path, mode="r") as h:
        for vid in out["ids"].values():
            assert os.listdir(path / "versions" / vid) == ["zarr.json"]
        # v1 writes every block: a pack from each node's leader
        assert len(glob.glob(str(path / "packs" / "*.pack"))) >= 2
        assert h.verify()
    proc, _ = _mpiexec(3, SCRIPT, "load", path)
    assert [r["verified"] for r in _lines(proc)] == [["v1", "v2", "v3"]] * 3
