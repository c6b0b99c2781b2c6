"""The ``vlcc`` command line."""

import subprocess
import sys

import pytest

from vlcc_adjoint.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "revolve", "--steps", "100", "--snapshots", "5"],
        [
            "plan",
            "multistage",
            "--steps",
            "60",
            "--snapshots",
            "2",
            "--disk",
            "3",
            "--forward-cost",
            "3",
        ],
        ["plan", "online", "--steps", "300", "--snapshots", "6"],
        ["plan", "periodic", "--steps", "50", "--every", "7"],
        ["plan", "storeall", "--steps", "20"],
    ],
)
def test_plan_prints_the_statistics_of_every_schedule(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "forward_count" in out and "peak_slots" in out


def test_plan_revolve_reports_the_binomial_optimum(capsys):
    main(["plan", "revolve", "--steps", "1000", "--snapshots", "20"])
    out = capsys.readouterr().out
    assert "forward_count    2747" in out
    assert "t(n, c) = 2747 forward steps" in out


def test_plan_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "revolve.png"
    assert main(["plan", "revolve", "--steps", "40", "--snapshots", "4", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_a_clear_error_not_a_traceback():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlcc_adjoint",
            "plan",
            "revolve",
            "--steps",
            "10000000",
            "--snapshots",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "argument --snapshots: must be an integer >= 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_checks_its_gradient_and_draws_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "demo",
                "--nx",
                "90",
                "--nz",
                "90",
                "--steps",
                "300",
                "--memory-states",
                "8",
                "--disk-states",
                "12",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "gradient check PASSED" in out
    assert "Multistage" in out and "zarr" in out
    assert (tmp_path / "vlcc_demo_gradient.png").stat().st_size > 10_000


def test_bench_runs_the_chosen_benchmarks_and_indexes_their_results(tmp_path, monkeypatch):
    import json

    # bench_multistage keeps its copy of the old module in the temporary
    # directory across runs, a cache of its own: here, in this test's folder.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    rc = main(["bench", "--quick", "--only", "multistage", "--out", str(tmp_path)])
    assert rc == 0
    index = json.loads((tmp_path / "run_all.json").read_text())
    result = json.loads((tmp_path / "bench_multistage.json").read_text())
    assert [run["name"] for run in index["runs"]] == ["multistage"]
    assert index["runs"][0]["status"] == 0
    assert {row["n"] for row in result["rows"]} == {1000, 10000}
    assert all(row["new"]["optimal_time"] > 0 for row in result["rows"])


def test_bench_rejects_an_unknown_benchmark():
    assert main(["bench", "--only", "nonesuch"]) != 0


def test_bench_help_names_the_command_it_was_given_as(capsys):
    assert main(["bench", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: vlcc bench ")


def test_version_prints_the_package_version(capsys):
    import vlcc_adjoint

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vlcc {vlcc_adjoint.__version__}"


def test_version_runs_as_a_command():
    import vlcc_adjoint

    result = subprocess.run(
        [sys.executable, "-m", "vlcc_adjoint", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"vlcc {vlcc_adjoint.__version__}"


def test_the_package_declares_its_license():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    text = (root / "LICENSE").read_text()
    assert "Copyright (c)" in text and "vlcc-adjoint developers" in text
    assert "Redistribution and use in source and binary forms" in text


def _vlcc(*argv, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "vlcc_adjoint", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--png", "/nonexistent/dir/x.png"], "/nonexistent/dir does not exist"),
        (["demo", "--png", "{tmp}"], "is a directory"),
        (["demo", "--png", "{tmp}/x.nosuchformat"], "cannot write .nosuchformat files"),
        (["plan", "--plot", "/nonexistent/x.png"], "/nonexistent does not exist"),
        (["plan", "--plot", "{tmp}"], "is a directory"),
        (["demo", "--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        (["demo", "--nx", "3"], "argument --nx: must be an integer >= 17"),
        (
            ["demo", "--disk-states", "-1"],
            "argument --disk-states: must be an integer >= 0, got -1",
        ),
        (["plan", "--forward-cost", "-1"], "argument --forward-cost: must be a finite number >= 0"),
        (["plan", "--steps", "abc"], "argument --steps: must be an integer >= 1, got 'abc'"),
        (["plan", "--unknown"], "unrecognized arguments: --unknown (see vlcc plan --help)"),
        (["demo", "--memory-states", "1"], "give --memory-states 4 or more"),
        (["demo", "--memory-states", "0", "--disk-states", "0"], "give --memory-states 1 or more"),
        (
            ["plan", "revolve", "--steps", "2000000000", "--snapshots", "1"],
            "give --steps 300,000,000 or fewer",
        ),
    ],
)
def test_bad_arguments_fail_fast_with_one_line(argv, message, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    result = _vlcc(*argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlcc: error: "), result.stderr
    assert message in lines[0], lines[0]
    assert result.stdout == ""  # nothing ran
    assert list(tmp_path.iterdir()) == []


def test_memory_budget_error_speaks_in_states_not_bytes():
    result = _vlcc("demo", "--memory-states", "1")
    assert "bytes" not in result.stderr
    assert "1 state" in result.stderr
