"""States from any language: the C and Fortran interface.

A C, C++ or Fortran program that computes an adjoint runs the schedules,
the tiered store and the lineage of this package on its own memory: it
*protects* its memory regions (the state's arrays, by name) and asks
"what next?", revolve's reverse communication (Griewank & Walther,
*Algorithm 799: revolve*, ACM TOMS 26(1), 2000; VeloC's
``VELOC_Mem_protect`` for the regions).  The engine performs the saves,
loads, moves and deletes the schedule asks for on those regions, with its
planned read-ahead, Belady eviction and tiers (memory, compressed memory,
zarr on disk), and answers ADVANCE, TURN, REVERSE or DONE.  The same
regions commit to and check out from a :class:`~vlcc_adjoint.lineage.History`,
in its format.

The interface is ``vlcc.h`` (C) and the module ``vlcc`` (Fortran 2008, with
``iso_c_binding``), shipped in this package with the C library's source.
The flags to build against them, as ``pkg-config`` prints them::

    cc prog.c $(python -m vlcc_adjoint.capi --cflags --libs) -o prog
    gfortran prog.f90 $(python -m vlcc_adjoint.capi --fflags) -o prog

(the first use builds ``libvlcc`` into a per-user cache: :func:`build`).
The program then runs from any directory without environment variables.

How it is built.  ``libvlcc`` embeds CPython (it starts the interpreter
that built it, unless the program runs one already) and is a thin layer:
each function takes the GIL for its own call and releases it on return, so
the store's background threads (writes to slower levels, read-ahead) run
while the program computes; copies between the regions and the engine's
buffers are the store's native kernels (one pass, checksum included).
``vlcc_run_next`` resumes the iterator of the run's answers, which pulls
the schedule's rows through the one action machine,
:class:`vlcc_adjoint.schedules.Machine` in pull mode: the C side interprets
nothing.

The lifetime rule: a protected region must stay valid, at the same address,
from its ``protect`` to the ``close`` of its run or history; the engine
touches it only during that handle's calls.  The regions are wrapped as
numpy arrays over the program's memory, never copied by the wrapping,
never kept by the store (a save copies, a restore writes into them).

The pieces: :mod:`~vlcc_adjoint.capi._config` (``config_json``),
:mod:`~vlcc_adjoint.capi._run` (the run and its answers, TURN included),
:mod:`~vlcc_adjoint.capi._history` (commit and checkout of regions),
:mod:`~vlcc_adjoint.capi._regions` (wrapping and filling the regions),
:mod:`~vlcc_adjoint.capi._bridge` (what each C function calls, and the
error codes), :mod:`~vlcc_adjoint.capi._build` (the build and its cache).
"""

from ._build import Build as Build
from ._build import build as build
from ._build import cache_root as cache_root
from ._build import cflags as cflags
from ._build import fflags as fflags
from ._build import libs as libs
from ._header import FORTRAN_SOURCE as FORTRAN_SOURCE
from ._header import HEADER as HEADER
from ._header import SOURCE as SOURCE
from ._regions import DTYPES as DTYPES

__all__ = [
    "DTYPES",
    "FORTRAN_SOURCE",
    "HEADER",
    "SOURCE",
    "Build",
    "build",
    "cache_root",
    "cflags",
    "fflags",
    "libs",
]
