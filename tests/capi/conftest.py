"""Fixtures of the C and Fortran interface's tests: a build, compiled programs, a clean run.

The library is built once per session into a cache of the session's own
(:func:`vlcc_adjoint.capi.build`), the test programs of ``programs/`` and the
examples are compiled with the flags it gives, and every program runs with an
environment that names neither Python nor the package (no ``PYTHONPATH``,
no virtual environment): what a user's program gets.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from vlcc_adjoint import capi


def _compile(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"compiling {what} failed:\n{' '.join(command)}\n{proc.stdout}{proc.stderr}")


@pytest.fixture(scope="session")
def capi_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("capi-cache")


@pytest.fixture(scope="session")
def c_build(capi_cache) -> capi.Build:
    return capi.build(cache=capi_cache)


@pytest.fixture(scope="session")
def fortran_build(capi_cache) -> capi.Build:
    if shutil.which("gfortran") is None:
        pytest.skip("gfortran is not installed (.ci/run installs it: apt-get install gfortran)")
    return capi.build(fortran=True, cache=capi_cache)


@pytest.fixture(scope="session")
def c_program(c_build, tmp_path_factory) -> Callable[[Path], Path]:
    """``c_program(source) -> executable``, compiled once per session with
    warnings as errors."""
    bindir = tmp_path_factory.mktemp("c-programs")
    done: dict[Path, Path] = {}

    def compile_c(source: Path) -> Path:
        if source not in done:
            exe = bindir / f"{source.parent.name}-{source.stem}"
            _compile(
                [
                    "cc",
                    "-std=c11",
                    "-D_DEFAULT_SOURCE",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    str(source),
                    *c_build.cflags(),
                    *c_build.libs(),
                    "-lm",
                    "-lpthread",
                    "-o",
                    str(exe),
                ],
                str(source),
            )
            done[source] = exe
        return done[source]

    return compile_c


@pytest.fixture(scope="session")
def fortran_program(fortran_build, tmp_path_factory) -> Callable[[Path], Path]:
    """``fortran_program(source) -> executable``, compiled once per session."""
    bindir = tmp_path_factory.mktemp("fortran-programs")
    done: dict[Path, Path] = {}

    def compile_fortran(source: Path) -> Path:
        if source not in done:
            exe = bindir / f"{source.parent.name}-{source.stem}"
            _compile(
                [
                    "gfortran",
                    "-std=f2018",
                    "-Wall",
                    "-Werror",
                    "-J",  # the .mod files of the program's own modules: not in the cwd
                    str(bindir),
                    str(source),
                    *fortran_build.cflags(),
                    *fortran_build.libs(),
                    "-o",
                    str(exe),
                ],
                str(source),
            )
            done[source] = exe
        return done[source]

    return compile_fortran
