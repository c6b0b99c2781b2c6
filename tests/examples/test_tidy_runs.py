"""The test session leaves nothing in the temporary directory, and says so if it would.

``tests/conftest.py`` runs the session with ``TMPDIR`` at a folder of its
own and fails the session if anything is left there; here a copy of it runs
small sessions in a fresh interpreter, one that leaks and one that does not.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

CONFTEST = pathlib.Path(__file__).resolve().parents[1] / "conftest.py"

LEAKY = """
import os, tempfile

def test_leaves_a_folder():
    tempfile.mkdtemp(prefix="leaky-")

def test_leaves_a_file():
    fd, _ = tempfile.mkstemp(prefix="stray-", suffix=".txt")
    os.close(fd)
"""

TIDY = """
import os, subprocess, sys, tempfile

def test_uses_tmp_path_and_cleans_up(tmp_path):
    (tmp_path / "kept-by-pytest").write_text("pytest keeps its own folders")
    with tempfile.TemporaryDirectory() as scratch:
        open(os.path.join(scratch, "x"), "w").close()
    assert not str(tmp_path).startswith(os.environ["TMPDIR"])

def test_a_child_process_sees_the_session_folder():
    out = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out == os.environ["TMPDIR"] and os.path.basename(out).startswith("vlcc-tests-")
"""


def _session(tmp_path, name, body):
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(CONFTEST, folder / "conftest.py")
    (folder / f"test_{name}.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )


def test_a_session_that_leaves_files_fails_and_lists_them(tmp_path):
    result = _session(tmp_path, "leaky", LEAKY)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert "files left in TMPDIR" in result.stdout
    assert "leaky-" in result.stdout and "(0 files)" in result.stdout
    assert "stray-" in result.stdout
    folder = result.stdout.split("TMPDIR=")[1].split()[0]
    assert not os.path.exists(folder)  # removed all the same


def test_a_tidy_session_passes(tmp_path):
    result = _session(tmp_path, "tidy", TIDY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "files left" not in result.stdout
