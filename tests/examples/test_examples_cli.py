"""The example scripts as commands: ``--help`` answers at once, ``--dir`` keeps
what the help says, and a run leaves nothing in the temporary directory.

Each script runs in a fresh interpreter, as a user would start it; the
numeric options' checks are in ``tests/cli/test_options.py``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from vlcc_adjoint.lineage import History

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def _run(script, *args, cwd, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_options_and_runs_nothing(script, tmp_path):
    result = _run(script, "--help", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: {script}"), result.stdout[:500]
    assert "options:" in result.stdout and "--help" in result.stdout
    assert list(tmp_path.iterdir()) == []  # no figure, no checkpoint, nothing


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"lineage_{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_creates_its_work_directory_and_keeps_the_history_there(tmp_path):
    work = tmp_path / "not" / "yet"
    argv = ["--steps", "60", "--every", "20", "--n", "200", "--from-step", "20"]
    result = _recipe("replay").main([*argv, "--to-step", "40", "--dir", str(work)])
    assert result["bitwise"]
    with History(work / "wave.vlcc", mode="r") as h:
        assert "replay" in h.branches and len(h.log("main")) == 4  # steps 0, 20, 40, 60


def test_migrate_creates_its_work_directory_and_keeps_the_runs_there(tmp_path):
    work = tmp_path / "new"
    result = _recipe("migrate").main(
        ["--steps", "40", "--every", "10", "--n", "12", "--dir", str(work)]
    )
    assert result["identical"]
    assert sorted(os.listdir(work)) == ["machine-a", "machine-b", "machine-c", "run.tar"]
    for place in ("machine-a", "machine-b", "machine-c"):
        with History(work / place / "run.vlcc", mode="r") as h:
            assert len(h.log()) >= 2


@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("lineage_replay.py", ["--from-step", "30"], "--from-step 30 is not a stored step"),
        ("lineage_replay.py", ["--from-step", "80", "--to-step", "40"], "must come before"),
        ("lineage_migrate.py", ["--steps", "10", "--every", "20"], "give --steps 40 or more"),
        ("lineage_migrate.py", ["--dir", "{file}"], "--dir {file}: "),
    ],
)
def test_examples_refuse_inconsistent_options_in_one_line(script, argv, message, tmp_path):
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    argv = [a.replace("{file}", str(occupied)) for a in argv]
    result = _run(script, *argv, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message.replace("{file}", str(occupied)) in lines[0], lines
    assert result.stdout == ""


def test_a_second_run_into_the_same_directory_is_refused(tmp_path):
    argv = ["--steps", "40", "--every", "10", "--n", "8", "--dir", str(tmp_path / "w")]
    assert _run("lineage_migrate.py", *argv, cwd=tmp_path).returncode == 0
    again = _run("lineage_migrate.py", *argv, cwd=tmp_path)
    assert again.returncode == 2 and "already holds machine-a" in again.stderr
    assert again.stderr.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_deepspeed_example_leaves_nothing_in_the_temporary_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), DS_BUILD_OPS="0")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # torch's cache, kept by design
    result = _run(
        "torch_deepspeed_checkpoint.py", "--steps", "4", "--every", "2", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global_step4" in result.stdout
    assert list(scratch.iterdir()) == []
    kept = tmp_path / "kept"
    result = _run(
        "torch_deepspeed_checkpoint.py",
        *("--steps", "4", "--every", "2", "--dir", kept),
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (kept / "vlcc-history").is_dir() and list(scratch.iterdir()) == []
