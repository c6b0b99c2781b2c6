"""What the C and Fortran interface's tests share: paths, and running a program clean."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"
EXAMPLES = ROOT / "examples"

#: The environment programs run with: nothing of Python's.
CLEAN_ENV = {"PATH": os.defpath, "LC_ALL": "C"}


def run_program(
    exe: Path, *args: str, cwd: Path, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `exe` in `cwd` with :data:`CLEAN_ENV`; with `check`, fail the test
    (showing its output) unless it exits 0."""
    proc = subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{exe.name} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return proc
