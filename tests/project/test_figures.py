"""``benchmarks/figures.py``: the figures of the benchmarks that write only JSON."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _module("vlcc_bench_figures", BENCH / "figures.py")


def _assert_png(path: Path, min_bytes: int = 20_000):
    assert path.is_file(), f"{path} was not written"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes: an empty figure?"


def _committed(name: str) -> dict:
    path = RESULTS / f"bench_{name}.json"
    if not path.is_file():
        pytest.skip(f"{path} is not committed")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(figures.FIGURES))
def test_each_committed_result_draws_a_png(name, tmp_path):
    _committed(name)
    path = figures.draw(name, RESULTS, out=tmp_path)
    assert path == tmp_path / f"bench_{name}.png"
    _assert_png(path)


def test_draw_all_reports_what_it_drew_and_skips_missing_json(tmp_path):
    (tmp_path / "bench_multistage.json").write_text(json.dumps(_committed("multistage")))
    said = []
    drawn = figures.draw_all(tmp_path, only=["multistage", "tiers"], log=said.append)
    assert drawn == {"multistage": tmp_path / "bench_multistage.png", "tiers": None}
    _assert_png(drawn["multistage"])
    assert any("skipped bench_tiers" in line for line in said)


def _variants():
    """Partial and --quick-shaped results, as the scripts write them."""
    torch = _committed("torch")
    only_a = {k: v for k, v in torch.items() if k != "b"}
    only_b = {k: v for k, v in torch.items() if k != "a"}
    quick_a = copy.deepcopy(only_a)  # --quick: fewer segment counts, one budget below floor
    quick_a["meta"]["quick"] = True
    quick_a["a"]["rows"] = [
        r
        for r in quick_a["a"]["rows"]
        if "s=4" in r["name"] or r["kind"] == "plain" or r.get("vs") == 4
    ]
    multistage = copy.deepcopy(_committed("multistage"))  # run_all's --only-new run
    for row in multistage["rows"]:
        row["old"], row["old_predicted_cpu"] = None, None
    lineage = copy.deepcopy(_committed("lineage"))  # no torch, no (b)/(c), 2 repeats
    lineage.pop("all_changed")
    lineage.pop("all_changed_with_computation")
    lineage["quick"], lineage["torch"] = True, False
    for part in (lineage["summary"], lineage["runs"]):
        part.pop("torch.save")
    lineage["runs"] = {m: runs[:2] for m, runs in lineage["runs"].items()}
    overlap = copy.deepcopy(_committed("overlap"))  # medians only
    for part in ("forward", "backward"):
        overlap[part].pop("runs")
    overlap["args"]["quick"] = True
    tiers = copy.deepcopy(_committed("tiers"))  # --quick: fewer repeats
    tiers["quick"] = True
    for row in tiers["tiers"] + tiers["capture"]:
        row["times_s"] = row["times_s"][:5]
    return {
        "torch-a": ("torch", only_a),
        "torch-b": ("torch", only_b),
        "torch-quick": ("torch", quick_a),
        "multistage-only-new": ("multistage", multistage),
        "lineage-quick-no-torch": ("lineage", lineage),
        "overlap-medians": ("overlap", overlap),
        "tiers-quick": ("tiers", tiers),
    }


@pytest.mark.parametrize(
    "variant",
    [
        "torch-a",
        "torch-b",
        "torch-quick",
        "multistage-only-new",
        "lineage-quick-no-torch",
        "overlap-medians",
        "tiers-quick",
    ],
)
def test_partial_and_quick_results_are_drawn(variant, tmp_path):
    name, data = _variants()[variant]
    (tmp_path / f"bench_{name}.json").write_text(json.dumps(data))
    _assert_png(figures.draw(name, tmp_path))


def test_malformed_json_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "bench_tiers.json"
    bad.write_text('{"capture": [')
    with pytest.raises(figures.ResultError, match="bench_tiers.json"):
        figures.draw("tiers", tmp_path)
    assert not (tmp_path / "bench_tiers.png").exists()


def test_json_without_the_fields_a_figure_needs_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "bench_overlap.json").write_text(json.dumps({"benchmark": "bench_overlap"}))
    with pytest.raises(figures.ResultError, match=r"bench_overlap\.json.*forward"):
        figures.draw("overlap", tmp_path)


def test_command_line_fails_on_a_malformed_json_and_says_which(tmp_path, capsys):
    (tmp_path / "bench_lineage.json").write_text("[1, 2]")
    assert figures.main(["--results", str(tmp_path), "--only", "lineage"]) == 1
    assert "bench_lineage.json" in capsys.readouterr().err


def test_run_all_records_a_figure_it_cannot_draw_as_a_failure(tmp_path):
    run_all = _module("vlcc_bench_run_all", BENCH / "run_all.py")
    (tmp_path / "bench_torch.json").write_text("not json")
    record = {"name": "torch", "status": 0, "written": ["bench_torch.json"]}
    assert run_all.draw_figure(record, tmp_path) is False
    assert record["figure"]["status"] == "failed"
    assert "bench_torch.json" in record["figure"]["error"]

    (tmp_path / "bench_torch.json").write_text(json.dumps(_committed("torch")))
    record = {"name": "torch", "status": 0, "written": ["bench_torch.json"]}
    assert run_all.draw_figure(record, tmp_path) is True
    assert record["figure"] == {"status": 0, "path": "bench_torch.png"}
    assert "bench_torch.png" in record["written"]
    _assert_png(tmp_path / "bench_torch.png")
