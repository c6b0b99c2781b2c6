"""The build of ``libvlcc``: a per-user cache keyed by the sources, concurrent
first builds that do not corrupt each other, flags as ``pkg-config`` prints
them, nothing written into the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlcc_adjoint import capi
from vlcc_adjoint.capi import _build
from vlcc_adjoint.capi.__main__ import main
from vlcc_adjoint.errors import VlccError


def _package_files() -> dict[str, int]:
    here = Path(capi.__file__).parent
    return {
        str(p.relative_to(here)): p.stat().st_mtime_ns
        for p in here.rglob("*")
        if "__pycache__" not in p.parts
    }


def test_concurrent_first_builds_agree_and_leave_nothing_half_built(tmp_path):
    cache = tmp_path / "cache"
    before = _package_files()
    command = [sys.executable, "-m", "vlcc_adjoint.capi", "--cflags", "--libs"]
    procs = [
        subprocess.Popen(
            [*command, "--cache-dir", str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len({out for out, _ in outs}) == 1  # the same flags: one build
    flags = outs[0][0].split()
    lib = next(f[2:] for f in flags if f.startswith("-L"))
    assert f"-Wl,-rpath,{lib}" in flags and "-lvlcc" in flags  # runs without LD_LIBRARY_PATH
    assert (Path(lib) / "libvlcc.so").is_file()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == []
    assert len([p for p in cache.iterdir() if p.name.startswith("c-")]) == 1
    assert _package_files() == before  # nothing written into the package


def test_a_build_is_reused_and_changed_sources_get_a_build_of_their_own(
    c_build, capi_cache, tmp_path, monkeypatch
):
    assert capi.build(cache=capi_cache) == c_build  # cached: the same directories
    changed = tmp_path / "vlcc.c"
    changed.write_text(capi.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(_build, "SOURCE", changed)
    other = capi.build(cache=capi_cache)
    assert other.lib != c_build.lib and (other.lib / "libvlcc.so").is_file()


def test_a_missing_compiler_is_named(tmp_path):
    with pytest.raises(VlccError, match="no-such-cc was not found"):
        capi.build(cc="no-such-cc", cache=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing started


def test_the_flags_command_refuses_no_request(capsys):
    with pytest.raises(SystemExit):
        main([])
    assert "ask for --cflags, --libs, --fflags or --dirs" in capsys.readouterr().err
