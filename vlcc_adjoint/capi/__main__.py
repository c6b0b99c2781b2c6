"""``python -m vlcc_adjoint.capi --cflags | --libs | --fflags``: compiler flags, as pkg-config prints them.

Builds the library (and with ``--fflags`` the Fortran module) into the
per-user cache on first use (:func:`vlcc_adjoint.capi.build`), then prints
the flags on one line::

    cc prog.c $(python -m vlcc_adjoint.capi --cflags --libs) -o prog
    gfortran prog.f90 $(python -m vlcc_adjoint.capi --fflags) -o prog

Put them after the sources: linkers that drop unused libraries
(``--as-needed``) read the command line in order.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import VlccError
from ._build import build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vlcc_adjoint.capi",
        description="Print the flags to build C and Fortran programs against vlcc.h and "
        "the Fortran module vlcc (building them into the per-user cache on first use).",
    )
    parser.add_argument("--cflags", action="store_true", help="C compiler flags")
    parser.add_argument("--libs", action="store_true", help="C linker flags")
    parser.add_argument(
        "--fflags", action="store_true", help="Fortran compiler and linker flags (use vlcc)"
    )
    parser.add_argument("--dirs", action="store_true", help="print the build's directories instead")
    parser.add_argument("--cc", default="cc", help="the C compiler (default: cc)")
    parser.add_argument("--fc", default="gfortran", help="the Fortran compiler (default: gfortran)")
    parser.add_argument("--cache-dir", help="the build cache (default: ~/.cache/vlcc-adjoint/capi)")
    args = parser.parse_args(argv)
    if not (args.cflags or args.libs or args.fflags or args.dirs):
        parser.error("ask for --cflags, --libs, --fflags or --dirs")
    try:
        b = build(fortran=args.fflags, cc=args.cc, fc=args.fc, cache=args.cache_dir)
    except VlccError as err:
        print(f"python -m vlcc_adjoint.capi: {err}", file=sys.stderr)
        return 1
    if args.dirs:
        for name, path in (("include", b.include), ("lib", b.lib)):
            print(f"{name}: {path}")
        if b.c is not None:
            print(f"c include: {b.c.include}\nc lib: {b.c.lib}")
        return 0
    c = b.c if b.c is not None else b
    flags: list[str] = []
    if args.cflags:
        flags += c.cflags()
    if args.libs:
        flags += c.libs()
    if args.fflags:
        flags += [f for f in [*b.cflags(), *b.libs()] if f not in flags]
    print(" ".join(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
