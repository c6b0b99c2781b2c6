"""History(path, comm=comm): versions of distributed states, committed on P ranks, loaded on Q.

The scripts run under ``mpiexec`` (oversubscribed on a small machine) and
check every rank's block bit for bit against the global functions of
``mpi_scripts/lineage_mpi.py``; this file checks what a serial process sees
of the same repository: the global arrays, the log, diffs block by block,
deduplication and deltas per block, gc, and damage named by its file.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest
from test_mpi import _mpiexec, _ok, needs_mpi

from vlcc_adjoint.lineage import CorruptCheckpointError, History, KeepPolicy

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "mpi" / "mpi_scripts" / "lineage_mpi.py"
sys.path.insert(0, str(ROOT / "tests" / "lineage"))
sys.path.insert(0, str(SCRIPT.parent))

pytestmark = needs_mpi


def _lines(proc) -> list[dict]:
    """The JSON object each rank printed, ordered by rank (mpiexec may forward
    two ranks' lines glued together)."""
    text, decoder, out, k = _ok(proc), json.JSONDecoder(), [], 0
    while (k := text.find('{"rank"', k)) >= 0:
        obj, k = decoder.raw_decode(text, k)
        out.append(obj)
    return sorted(out, key=lambda d: d["rank"])


def _commit(path, n: int, *extra) -> dict:
    proc, _ = _mpiexec(n, SCRIPT, "commit", path, *extra)
    ranks = _lines(proc)
    assert len(ranks) == n and all(r["ids"] == ranks[0]["ids"] for r in ranks)
    return ranks[0]


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """A repository written by 4 ranks: v1, v2 (rows 0..4 of u changed), alt: v3."""
    path = tmp_path_factory.mktemp("lineage_mpi") / "h"
    return path, _commit(path, 4)


def test_a_version_committed_on_4_ranks_loads_bitwise_on_3_and_on_1(committed):
    path, _ = committed
    for q in (3, 1):
        proc, _ = _mpiexec(q, SCRIPT, "load", path)
        ranks = _lines(proc)
        assert [r["verified"] for r in ranks] == [["v1", "v2", "v3"]] * q


def test_a_serial_history_loads_the_global_arrays_and_reads_the_log(committed):
    from lineage_mpi import fields, params

    path, out = committed
    ids = out["ids"]
    with History(path, mode="r") as h:
        assert [v.id for v in h.log("main")] == [ids["v2"], ids["v1"]]
        assert h.branches == {"main": ids["v2"], "alt": ids["v3"]}
        assert h.tags == {"first": ids["v1"]}
        assert h.version(ids["v3"]).parents == (ids["v1"],)
        for version, vid in ids.items():
            state = h.load(vid)
            for key, arr in fields(version).items():
                assert isinstance(state[key], np.ndarray)
                assert state[key].dtype == arr.dtype and state[key].tobytes() == arr.tobytes()
            assert state["params"]["kappa"] == params(version)["kappa"]
        # every rank's block is a leaf of the version: 4 blocks of u, 4 of c, 1 levels
        assert len(h.leaves(ids["v1"])) == 9


def test_diff_names_the_changed_blocks_and_unchanged_blocks_cost_nothing(committed):
    path, out = committed
    ids, written = out["ids"], out["written"]
    with History(path, mode="r") as h:
        d = h.diff(ids["v1"], ids["v2"])
        changed = [leaf.path for leaf in d.leaves if leaf.status == "changed"]
        assert changed == ["state['u'][0]"], changed  # rows 0..4: rank 0's block of u
        assert d.values  # t changed
        # only the changed chunks of rank 0's block were written
        assert 0 < written["v2"] < written["v1"] / 5, written
        other = [leaf.path for leaf in h.diff("main", "alt").leaves if leaf.status == "changed"]
        assert sorted(other) == sorted(
            [f"state['c'][{r}]" for r in range(4)] + ["state['u'][0]"]
        ), other


def test_a_failing_rank_fails_the_commit_on_every_rank_and_adds_nothing(tmp_path):
    path = tmp_path / "h"
    _commit(path, 2)
    with History(path, mode="r") as h:
        before = {v.id for v in h.log(all=True)}
    proc, _ = _mpiexec(2, SCRIPT, "fail", path)
    ranks = _lines(proc)
    assert len(ranks) == 2
    for r in ranks:
        assert r["failed"].startswith("rank 1 failed while checking the state"), r
        assert "state['bad']" in r["failed"]
        assert "decomposition over 3 ranks" in r["other"]
    with History(path) as h:
        assert {v.id for v in h.log(all=True)} == before
        assert h.gc().removed == ()


def test_deltas_per_block_and_gc_keep_every_version_loadable(tmp_path):
    from lineage_mpi import fields

    path = tmp_path / "h"
    out = _commit(path, 2, "deltas")
    ids = out["ids"]
    with History(path) as h:
        assert h.deltas
        report = h.gc(keep=KeepPolicy(last=1, tagged=True))
        assert ids["v1"] not in report.removed  # tagged "first"
        kept = {v.id for v in h.log(all=True)}
        for version, vid in ids.items():
            if vid in kept:
                state = h.load(vid)
                assert state["u"].tobytes() == fields(version)["u"].tobytes()
    proc, _ = _mpiexec(3, SCRIPT, "load", path)
    assert all(r["verified"] for r in _lines(proc))


def test_a_damaged_block_raises_corrupt_checkpoint_naming_the_file(tmp_path):
    path = tmp_path / "h"
    ids = _commit(path, 2)["ids"]
    with History(path, mode="r") as h:
        info = h.leaves(ids["v1"])[1]  # rank 1's block of u
    leaf_dir = path / info.array
    chunk = sorted(p for p in leaf_dir.iterdir() if p.name != "zarr.json")[0]
    target = path / "chunks" / os.path.relpath(os.path.realpath(chunk), path / "chunks")
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0xFF
    os.chmod(chunk, 0o644)
    chunk.write_bytes(bytes(data))  # a hard link: the chunk store's file changes too
    with History(path, mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as err:
            h.load(ids["v1"])
    assert err.value.path is not None and os.path.samefile(err.value.path, target)
    proc, _ = _mpiexec(2, SCRIPT, "load", path, timeout=120)
    assert proc.returncode != 0
    assert "CorruptCheckpointError" in proc.stderr and os.path.basename(err.value.path) in (
        proc.stderr
    )


def test_a_crafted_blocks_node_is_corrupt_not_assembled(tmp_path):
    from test_lineage_integrity import edit_manifest

    path = tmp_path / "h"
    ids = _commit(path, 2)["ids"]

    def shrink(attrs):  # claim that u has one row fewer than its blocks hold
        for node in attrs["spec"]["tree"]["items"][:1]:
            node["aux"]["decomposition"]["global_shape"][0] -= 1
            node["aux"]["decomposition"]["bounds"][0][-1] -= 1

    edit_manifest(path, ids["v1"], shrink, reseal=True)
    with History(path, mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as err:
            h.load(ids["v1"])
        assert err.value.path.endswith(os.path.join(ids["v1"], "zarr.json"))
        h.load(ids["v2"])  # the others are intact
    proc, _ = _mpiexec(2, SCRIPT, "load", path)
    assert proc.returncode != 0 and "CorruptCheckpointError" in proc.stderr


def test_a_version_committed_on_1_rank_loads_on_2(tmp_path):
    path = tmp_path / "h"
    _commit(path, 1)
    proc, _ = _mpiexec(2, SCRIPT, "load", path)
    assert [r["verified"] for r in _lines(proc)] == [["v1", "v2", "v3"]] * 2


def test_versions_of_different_rank_counts_compare_their_global_arrays(committed, tmp_path):
    path4, out4 = committed
    path2 = tmp_path / "h"
    ids2, ids4 = _commit(path2, 2)["ids"], out4["ids"]
    with History(path4, mode="r") as h4, History(path2, mode="r") as h2:
        same = h4.compare(ids4["v1"], ids2["v1"], other=h2)
        assert same and same.bitwise, same.reason
        assert [leaf.path for leaf in same.diff.leaves][:2] == ["state['c']", "state['u']"]
        other = h4.compare(ids4["v1"], ids2["v2"], other=h2)
        assert not other and other.first_leaf == "state['u']"
        assert other.first.n_changed == 5 * 7 and other.max_abs == 1.0
