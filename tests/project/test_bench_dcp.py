"""``benchmarks/bench_dcp.py --quick`` runs and writes what its docstring promises.

No timing is asserted (the machine is shared); the structure of the JSON and
the invariants that hold at any size are: every backend restores the saved
tensors exactly, stores only grow, DCP's files hold a full copy per version,
and with a frozen base our History stores less per version than DCP's files.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("icechunk")

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["vlcc", "vlcc_deltas", "dcp_fs", "icechunk", "icechunk_changed"]
FIELDS = {
    "save_s_cold",
    "save_s_warm",
    "save_s",
    "load_s_cold",
    "load_s_warm",
    "load_s",
    "bytes_after",
    "bytes_first",
    "bytes_per_version",
    "restored_equal",
    "per_version_vs_state",
    "per_version_vs_trainable",
}
#: measured in fresh processes, for the backends --quick names
MEMORY = {"rss_save_bytes", "rss_load_bytes", "save_s_new_process", "load_s_new_process"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_dcp.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"wrote {out / 'bench_dcp.json'}" in done.stdout
    return json.loads((out / "bench_dcp.json").read_text())


def test_every_backend_of_both_workloads_is_measured_and_restores_exactly(result):
    assert result["benchmark"] == "bench_dcp" and result["quick"] is True
    assert "--quick" in result["command"]
    for workload in ("full", "adapters"):
        w = result[workload]
        assert list(w["backends"]) == BACKENDS
        n = w["versions"]
        for name, b in w["backends"].items():
            assert FIELDS <= set(b), (workload, name)
            assert b["restored_equal"] is True, (workload, name)
            assert len(b["save_s"]) == len(b["bytes_after"]) == n
            assert len(b["load_s"]) == 1 + result["config"]["repeats"]
            assert all(x <= y for x, y in zip(b["bytes_after"], b["bytes_after"][1:])), name
            assert b["bytes_first"] == b["bytes_after"][0] > 0
            assert b["per_version_vs_state"] == pytest.approx(
                b["bytes_per_version"] / w["state_bytes"]
            )
            assert min(b["save_s"] + b["load_s"]) > 0
            if name in ("vlcc", "dcp_fs"):
                assert MEMORY <= set(b), (workload, name)
                assert b["rss_save_bytes"] >= 0 and b["rss_load_bytes"] >= 0
            else:
                assert not MEMORY & set(b), (workload, name)


def test_the_byte_counts_hold_what_each_store_promises(result):
    full, adapters = result["full"], result["adapters"]
    assert 0 < adapters["trainable_bytes"] < adapters["state_bytes"]
    for w in (full, adapters):
        # DCP's files: every version a full copy of the state (plus its metadata)
        assert w["backends"]["dcp_fs"]["bytes_per_version"] >= w["state_bytes"]
    a = adapters["backends"]
    # the frozen base is stored once by our History: a version costs less than a copy
    assert a["vlcc"]["bytes_per_version"] < a["dcp_fs"]["bytes_per_version"]
    assert a["icechunk_changed"]["bytes_per_version"] <= a["icechunk"]["bytes_per_version"]
    assert result["targets"]["adapters_per_version_le_1.1_trainable"] == (
        a["vlcc"]["per_version_vs_trainable"] <= 1.1
    )


def test_the_training_slowdown_is_recorded_per_repeat_with_the_load(result):
    t = result["training"]
    modes = {"vlcc_sync", "vlcc_async", "dcp_fs_sync", "dcp_fs_async", "torch_save_sync"}
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        assert t["deepspeed"] is False
    else:  # DeepSpeed's own engine and ours, each against DeepSpeed's loop without checkpoints
        assert t["deepspeed"] is True
        modes |= {"ds_default_sync", "ds_vlcc_sync"}
        assert len(t["seconds_ds_none"]) == t["repeats"]
    assert set(t["modes"]) == modes
    assert len(t["seconds_none"]) == t["repeats"] == result["config"]["train_repeats"]
    assert t["state_bytes"] == result["full"]["state_bytes"] and t["rss_none_bytes"] >= 0
    for name, m in t["modes"].items():
        none = t["seconds_ds_none"] if name.startswith("ds") else t["seconds_none"]
        assert len(m["seconds"]) == len(m["slowdown"]) == len(m["rss_peak_bytes"]) == t["repeats"]
        assert m["rss_peak_median_bytes"] == statistics.median(m["rss_peak_bytes"])
        assert len(m["blocked_fraction"]) == len(m["cpu_overhead"]) == t["repeats"]
        assert all(0 < b < s for b, s in zip(m["blocked_seconds"], m["seconds"]))
        assert m["blocked_fraction"] == pytest.approx(
            [b / (s - b) for b, s in zip(m["blocked_seconds"], m["seconds"])]
        )
        assert m["slowdown"] == pytest.approx([s / b - 1 for s, b in zip(m["seconds"], none)])
    assert len(t["load_before"]) == len(t["load_after"]) == 3


def test_the_durability_section_compares_fsync_with_fsync_and_none_with_none(result):
    d = result["durability"]
    assert d["state_bytes"] == result["full"]["state_bytes"]
    assert d["versions"] == result["config"]["versions"]
    assert d["pairs"] == {
        "fsync": {
            "ours": "vlcc_durable",
            "peer": "dcp_fs",
            "fsync": True,
            "warm_ratio": pytest.approx(
                d["backends"]["vlcc_durable"]["save_s_warm"]
                / d["backends"]["dcp_fs"]["save_s_warm"]
            ),
        },
        "no_fsync": {
            "ours": "vlcc",
            "peer": "dcp_fs_nosync",
            "fsync": False,
            "warm_ratio": pytest.approx(
                d["backends"]["vlcc"]["save_s_warm"] / d["backends"]["dcp_fs_nosync"]["save_s_warm"]
            ),
        },
    }
    for pair in d["pairs"].values():  # each pair: the same setting on both sides
        assert d["backends"][pair["ours"]]["fsync"] is d["backends"][pair["peer"]]["fsync"]
    assert {n: b["fsync"] for n, b in d["backends"].items()} == {
        "vlcc_durable": True,
        "dcp_fs": True,
        "vlcc": False,
        "dcp_fs_nosync": False,
    }
    for name, b in d["backends"].items():
        assert b["restored_equal"] is True, name
        assert len(b["save_s"]) == d["versions"] and min(b["save_s"]) > 0
        assert b["save_s_cold"] == b["save_s"][0]
        assert b["save_s_warm"] == statistics.median(b["save_s"][1:])
        assert b["bytes"] >= d["state_bytes"] and b["setup"]
    # the storage rows say which of them fsync too
    assert result["full"]["backends"]["dcp_fs"]["fsync"] is True
    assert result["full"]["backends"]["vlcc"]["fsync"] is False


def test_only_durability_replaces_that_section_and_keeps_the_rest_and_the_claims(result, tmp_path):
    before = dict(result)
    before["durability"] = {"stale": True}
    before["claims"] = {"x": {"says": "kept", "of": {"v": "/durability/versions"}, "unit": "count"}}
    (tmp_path / "bench_dcp.json").write_text(json.dumps(before))
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_dcp.py"),
            "--quick",
            "--only-durability",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = json.loads((tmp_path / "bench_dcp.json").read_text())
    assert {k: v for k, v in after.items() if k != "durability"} == {
        k: v for k, v in before.items() if k != "durability"
    }
    d = after["durability"]
    assert "stale" not in d and set(d["pairs"]) == {"fsync", "no_fsync"}
    assert "--only-durability" in d["command"] and "--only-durability" not in after["command"]
    assert d["machine"]["cpus"] == os.cpu_count()
