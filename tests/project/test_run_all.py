"""``benchmarks/run_all.py`` (``vlcc bench``): where a run writes, and what it
says while it runs.  Nothing here runs a benchmark: ``run_one`` and
``draw_figure`` are replaced by stand-ins that record their calls."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_all = _module("vlcc_bench_run_all_under_test", BENCH / "run_all.py")


def _inside(path: Path, folder: Path) -> bool:
    path, folder = Path(path).resolve(), folder.resolve()
    return path == folder or folder in path.parents


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_the_default_output_is_outside_the_tracked_results_and_the_source_tree(tmpdir_env):
    for argv in ([], ["--quick"], ["--full", "--only", "codecs"]):
        out = run_all.parse_args(argv).out
        assert not _inside(out, RESULTS), out
        assert not _inside(out, ROOT), out
        assert out == tmpdir_env / "vlcc-bench-results"


def test_the_default_without_tmpdir_is_in_tmp(monkeypatch):
    monkeypatch.delenv("TMPDIR", raising=False)
    assert run_all.parse_args(["--quick"]).out == Path("/tmp/vlcc-bench-results")


def test_only_update_results_writes_the_tracked_results():
    assert run_all.parse_args(["--update-results"]).out == RESULTS
    assert run_all.parse_args(["--out", "elsewhere"]).out == Path("elsewhere")


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--out", str(RESULTS)], "pass --update-results"),
        (["--out", str(RESULTS / "sub")], "inside benchmarks/results/"),
        (["--out", "x", "--update-results"], "drop --out"),
    ],
)
def test_writing_into_the_tracked_results_needs_the_flag(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        run_all.parse_args(argv)
    assert stop.value.code == 2
    assert said in capsys.readouterr().err


def test_the_program_name_is_the_callers(capsys):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--help"], prog="vlcc bench")
    assert capsys.readouterr().out.startswith("usage: vlcc bench ")
    assert run_all.main(["--only", "nonesuch"], prog="vlcc bench") == 2
    assert capsys.readouterr().err.startswith("usage: vlcc bench ")
    assert run_all.main(["--help"], prog="vlcc bench") == 0
    assert capsys.readouterr().out.startswith("usage: vlcc bench ")


def test_a_run_shows_progress_and_says_where_it_wrote(tmpdir_env, monkeypatch, capsys):
    ran = []

    def run_one(name, args, out, timeout):
        ran.append((name, out))
        (out / f"bench_{name}.json").write_text("{}")
        return {
            "name": name,
            "args": args,
            "status": 0 if name == "codecs" else 3,
            "wall_seconds": 1.0,
            "load_before": (0.5, 0, 0),
            "load_after": (0.6, 0, 0),
            "written": [f"bench_{name}.json"],
            "output_tail": "it broke",
        }

    monkeypatch.setattr(run_all, "run_one", run_one)
    monkeypatch.setattr(run_all, "draw_figure", lambda record, out: True)
    assert run_all.main(["--quick", "--only", "codecs", "tiers"], prog="vlcc bench") == 1
    out = tmpdir_env / "vlcc-bench-results"
    assert ran == [("codecs", out), ("tiers", out)]
    said = capsys.readouterr().out
    assert f"writing to {out}" in said
    assert re.search(r"^\[1/2\] bench_codecs \.\.\. \(run time 0:00:0\d\)$", said, re.M)
    assert re.search(r"^\[1/2\] bench_codecs ok in 1 s \(run time \d:\d\d:\d\d\)", said, re.M)
    assert re.search(r"^\[2/2\] bench_tiers FAILED \(3\) in 1 s", said, re.M)
    assert "it broke" in said
    assert f"wrote {out / 'run_all.json'}; 1 of 2 ran cleanly" in said
    index = json.loads((out / "run_all.json").read_text())
    assert index["command"] == "vlcc bench --quick --only codecs tiers"
    assert index["out"] == str(out)
    assert [run["name"] for run in index["runs"]] == ["codecs", "tiers"]


@pytest.mark.parametrize("script", sorted(BENCH.glob("bench_*.py")), ids=lambda p: p.name)
def test_no_benchmark_script_writes_into_the_source_tree_by_default(script, tmpdir_env):
    """Each script's own ``--out`` default (read from its source, so no
    benchmark runs) is the folder run_all uses."""
    calls = [
        node
        for node in ast.walk(ast.parse(script.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and any(isinstance(a, ast.Constant) and a.value == "--out" for a in node.args)
    ]
    assert len(calls) == 1, f"{script.name}: one --out argument"
    default = [kw.value for kw in calls[0].keywords if kw.arg == "default"]
    assert len(default) == 1, f"{script.name}: the --out argument has a default"
    assert ast.unparse(default[0]) == (
        "os.path.join(os.environ.get('TMPDIR') or '/tmp', 'vlcc-bench-results')"
    ), ast.unparse(default[0])
    assert run_all.default_out() == tmpdir_env / "vlcc-bench-results"


def test_the_script_help_runs_without_touching_the_results():
    before = {p.name: p.stat().st_mtime_ns for p in RESULTS.iterdir()}
    done = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--update-results" in done.stdout and "run_all.py" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in RESULTS.iterdir()} == before


def test_figures_redraws_the_tracked_results_elsewhere_unless_told(tmpdir_env, capsys):
    figures = _module("vlcc_bench_figures_under_test", BENCH / "figures.py")
    tracked = RESULTS / "bench_lineage.png"
    before = tracked.stat().st_mtime_ns
    assert figures.main(["--only", "lineage"]) == 0
    assert (tmpdir_env / "vlcc-bench-results" / "bench_lineage.png").stat().st_size > 10_000
    assert tracked.stat().st_mtime_ns == before
    assert f"writing the figures to {tmpdir_env / 'vlcc-bench-results'}" in capsys.readouterr().out


def _stand_in(ran, failing=()):
    def run_one(name, args, out, timeout):
        ran.append(name)
        return {
            "name": name,
            "args": args,
            "status": 3 if name in failing else 0,
            "wall_seconds": 1.0,
            "load_before": (0.5, 0, 0),
            "load_after": (0.6, 0, 0),
            "written": [],
            "output_tail": "",
        }

    return run_one


def test_every_run_records_its_source_commit():
    here = run_all.source()
    assert set(here) == {"commit", "changed"}
    assert here["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", here["commit"])


def test_resume_keeps_the_clean_runs_of_the_same_commit_and_reruns_the_rest(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(run_all, "draw_figure", lambda record, out: True)
    monkeypatch.setattr(run_all, "source", lambda: {"commit": "a" * 40, "changed": False})
    ran = []
    monkeypatch.setattr(run_all, "run_one", _stand_in(ran, failing={"tiers"}))
    argv = ["--quick", "--only", "codecs", "tiers", "--out", str(tmp_path)]
    assert run_all.main(argv) == 1
    assert ran == ["codecs", "tiers"]
    ran.clear()
    monkeypatch.setattr(run_all, "run_one", _stand_in(ran))
    assert run_all.main([*argv, "--resume"]) == 0
    assert ran == ["tiers"]  # the failed one again, the clean one kept
    assert "bench_codecs kept from the earlier run" in capsys.readouterr().out
    index = json.loads((tmp_path / "run_all.json").read_text())
    assert [(r["name"], r["status"]) for r in index["runs"]] == [("codecs", 0), ("tiers", 0)]
    ran.clear()
    assert run_all.main(["--full", *argv[1:], "--resume"]) == 0  # another size: nothing kept
    assert ran == ["codecs", "tiers"]


@pytest.mark.parametrize(
    "later", [{"commit": "b" * 40, "changed": False}, {"commit": "a" * 40, "changed": True}]
)
def test_resume_reruns_everything_for_other_or_changed_source(later, tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "draw_figure", lambda record, out: True)
    ran = []
    monkeypatch.setattr(run_all, "run_one", _stand_in(ran))
    monkeypatch.setattr(run_all, "source", lambda: {"commit": "a" * 40, "changed": False})
    argv = ["--quick", "--only", "codecs", "--out", str(tmp_path), "--resume"]
    assert run_all.main(argv) == 0
    monkeypatch.setattr(run_all, "source", lambda: later)
    assert run_all.main(argv) == 0
    assert ran == ["codecs", "codecs"]


def test_a_stopped_run_leaves_the_runs_it_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "draw_figure", lambda record, out: True)
    ran = []
    stand_in = _stand_in(ran)

    def run_one(name, args, out, timeout):
        if name == "tiers":
            raise KeyboardInterrupt
        return stand_in(name, args, out, timeout)

    monkeypatch.setattr(run_all, "run_one", run_one)
    with pytest.raises(KeyboardInterrupt):
        run_all.main(["--quick", "--only", "codecs", "tiers", "--out", str(tmp_path)])
    index = json.loads((tmp_path / "run_all.json").read_text())
    assert [r["name"] for r in index["runs"]] == ["codecs"]
