"""Building ``libvlcc`` (and the Fortran module) from the sources in the package.

The C library and the Fortran module are compiled on first use, from the
sources shipped in the package (``vlcc.h``, ``vlcc.c``, ``vlcc.f90``), into
a per-user cache (``$XDG_CACHE_HOME/vlcc-adjoint/capi``, by default
``~/.cache/vlcc-adjoint/capi``), never into the package: a build is keyed by
the hash of everything it depends on, so a changed source, another
interpreter, another copy of the package or another compiler gets a build
of its own, and an unchanged one is reused.

* The C build (``<key>/include/vlcc.h``, ``<key>/lib/libvlcc.so``) embeds
  the interpreter that runs the build: its executable (so that its virtual
  environment and site-packages are found), the directory of this package,
  and the path of ``libpython``, written into ``vlcc_config.h`` and
  compiled in, with an rpath to ``libpython``'s directory.  It needs a
  Python built with a shared ``libpython`` (``--enable-shared``; Debian's
  ``libpython3.X``), as every embedding does.
* The Fortran build (``<key>/include/vlcc.mod``,
  ``<key>/lib/libvlcc_fortran.so``) compiles ``vlcc.f90`` (with
  ``gfortran`` unless told otherwise) against a C build; a ``.mod`` file
  belongs to the compiler that wrote it, so the key includes its version.

Concurrent first builds do not corrupt each other: each process builds in a
temporary directory beside the final one and renames it into place (atomic
on one file system); a process that loses the race uses the winner's build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..errors import VlccRuntimeError
from ._header import FORTRAN_SOURCE, HEADER, SOURCE

__all__ = ["Build", "build", "cflags", "fflags", "libs"]

#: The directory of the ``vlcc_adjoint`` package whose sources are built
#: (put first on the embedded interpreter's ``sys.path``).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Build:
    """Where a build of the interface lies.

    **Attributes:**

    - `include`: the directory of ``vlcc.h`` (and ``vlcc.mod`` for a
      Fortran build).
    - `lib`: the directory of ``libvlcc.so`` (C) or ``libvlcc_fortran.so``.
    - `c`: for a Fortran build, the C build it links against; ``None``
      for a C build.
    """

    include: Path
    lib: Path
    c: Build | None = None

    def cflags(self) -> list[str]:
        """The C compiler's flags: the include directory."""
        return [f"-I{self.include}"]

    def libs(self) -> list[str]:
        """The linker's flags for ``libvlcc`` (and, for a Fortran build,
        ``libvlcc_fortran`` first), each directory with an rpath."""
        own = [f"-L{self.lib}", f"-Wl,-rpath,{self.lib}"]
        if self.c is None:
            return [*own, "-lvlcc"]
        return [*own, "-lvlcc_fortran", *self.c.libs()]


def cache_root() -> Path:
    """The per-user directory of the builds."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vlcc-adjoint" / "capi"


def _run(command: list[str], cwd: Path, what: str) -> str:
    try:
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise VlccRuntimeError(
            f"{what}: {command[0]} was not found; install it (Debian: apt-get install "
            f"{'gfortran' if 'fortran' in what else 'gcc'}) or name another compiler "
            "(--cc / --fc, or build(cc=..., fc=...))"
        ) from None
    if proc.returncode != 0:
        raise VlccRuntimeError(
            f"{what} failed (exit {proc.returncode}): {' '.join(command)}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return proc.stdout + proc.stderr


def _compiler_id(compiler: str) -> str:
    """The first line of ``compiler --version`` (part of a build's key)."""
    out = _run([compiler, "--version"], Path.cwd(), f"asking {compiler} its version")
    return out.splitlines()[0] if out else compiler


def _libpython() -> Path:
    """The shared ``libpython`` of this interpreter."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = sysconfig.get_config_var("LDLIBRARY") or ""
    candidates = [Path(libdir) / name]
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    candidates += [
        Path(libdir) / f"libpython{version}.so",
        Path(libdir) / f"libpython{version}.so.1.0",
    ]
    for path in candidates:
        if path.suffix != ".a" and ".so" in path.name and path.is_file():
            return path
    raise VlccRuntimeError(
        f"this Python ({sys.executable}) has no shared libpython in {libdir!r}, and libvlcc "
        "embeds Python through it: use a Python built with --enable-shared (Debian: "
        f"apt-get install libpython{sysconfig.get_python_version()}; pyenv: "
        "PYTHON_CONFIGURE_OPTS=--enable-shared)"
    )


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:20]


def _c_string(text: str) -> str:
    """`text` as a C string literal (JSON's escapes are C's, for these characters)."""
    return json.dumps(text)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished build `tmp` to `final`; if another process got
    there first, keep its build and drop ours."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "ok").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _build_c(cc: str, root: Path) -> Build:
    libpython = _libpython()
    include = sysconfig.get_paths()["include"]
    config = (
        f"#define VLCC_PYTHON_EXECUTABLE {_c_string(sys.executable)}\n"
        f"#define VLCC_PACKAGE_ROOT {_c_string(str(PACKAGE_ROOT))}\n"
        f"#define VLCC_LIBPYTHON {_c_string(str(libpython))}\n"
    )
    key = _key(
        "c",
        SOURCE.read_bytes(),
        HEADER.read_bytes(),
        config,
        include,
        sys.version,
        _compiler_id(cc),
    )
    final = root / f"c-{key}"
    if (final / "ok").is_file():
        return Build(final / "include", final / "lib")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (tmp / "include").mkdir()
        (tmp / "lib").mkdir()
        (tmp / "src").mkdir()
        shutil.copyfile(HEADER, tmp / "include" / "vlcc.h")
        shutil.copyfile(SOURCE, tmp / "src" / "vlcc.c")
        (tmp / "src" / "vlcc_config.h").write_text(config)
        _run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O2",
                "-std=c11",
                "-Wall",
                "-Wextra",
                f"-I{include}",
                f"-I{tmp / 'include'}",
                f"-I{tmp / 'src'}",
                str(tmp / "src" / "vlcc.c"),
                "-o",
                str(tmp / "lib" / "libvlcc.so"),
                "-Wl,-soname,libvlcc.so",
                f"-L{libpython.parent}",
                f"-Wl,-rpath,{libpython.parent}",
                f"-l:{libpython.name}",
                "-ldl",
                "-lpthread",
            ],
            tmp,
            "compiling libvlcc",
        )
        (tmp / "ok").write_text("")
        _publish(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Build(final / "include", final / "lib")


def _build_fortran(fc: str, c: Build, root: Path) -> Build:
    key = _key("fortran", FORTRAN_SOURCE.read_bytes(), str(c.lib), _compiler_id(fc))
    final = root / f"fortran-{key}"
    if (final / "ok").is_file():
        return Build(final / "include", final / "lib", c)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (tmp / "include").mkdir()
        (tmp / "lib").mkdir()
        shutil.copyfile(FORTRAN_SOURCE, tmp / "vlcc.f90")
        _run(
            [fc, "-c", "-fPIC", "-O2", "-J", str(tmp / "include"), "vlcc.f90", "-o", "vlcc.o"],
            tmp,
            "compiling the Fortran module vlcc",
        )
        _run(
            [
                fc,
                "-shared",
                "vlcc.o",
                "-o",
                str(tmp / "lib" / "libvlcc_fortran.so"),
                "-Wl,-soname,libvlcc_fortran.so",
                *c.libs(),
            ],
            tmp,
            "linking the Fortran module vlcc",
        )
        (tmp / "vlcc.o").unlink()
        (tmp / "vlcc.f90").unlink()
        (tmp / "ok").write_text("")
        _publish(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Build(final / "include", final / "lib", c)


def build(
    *,
    fortran: bool = False,
    cc: str = "cc",
    fc: str = "gfortran",
    cache: str | os.PathLike | None = None,
) -> Build:
    """Build ``libvlcc`` (and with `fortran` the module ``vlcc``) unless the
    cache holds a build of these sources for this interpreter; return where.

    **Arguments:**

    - `fortran`: build the Fortran module too, and return its build.
    - `cc`, `fc`: the C and Fortran compilers.
    - `cache`: the cache directory (default :func:`cache_root`).

    **Returns:** the :class:`Build` (C, or Fortran with its C build in
    ``.c``).

    Raises ``RuntimeError`` naming the missing compiler or ``libpython``, or
    with the compiler's output if a compilation fails.
    """
    root = Path(cache) if cache is not None else cache_root()
    c = _build_c(cc, root)
    return _build_fortran(fc, c, root) if fortran else c


def cflags(*, cc: str = "cc", cache: str | os.PathLike | None = None) -> list[str]:
    """``python -m vlcc_adjoint.capi --cflags``: the flags to compile C against ``vlcc.h``."""
    return build(cc=cc, cache=cache).cflags()


def libs(*, cc: str = "cc", cache: str | os.PathLike | None = None) -> list[str]:
    """``python -m vlcc_adjoint.capi --libs``: the flags to link C with ``libvlcc``."""
    return build(cc=cc, cache=cache).libs()


def fflags(
    *, cc: str = "cc", fc: str = "gfortran", cache: str | os.PathLike | None = None
) -> list[str]:
    """``python -m vlcc_adjoint.capi --fflags``: the flags to compile and
    link Fortran with the module ``vlcc`` (``use vlcc``)."""
    b = build(fortran=True, cc=cc, fc=fc, cache=cache)
    return [*b.cflags(), *b.libs()]
