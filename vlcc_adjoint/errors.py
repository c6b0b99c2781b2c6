"""The root of every error vlcc-adjoint raises on purpose.

Each public exception class derives from :class:`VlccError` *and* keeps the
builtin base it has always had (``InvalidScheduleError`` is still a
``ValueError``, ``StorageError`` still a ``RuntimeError``, ...), so::

    try:
        run_adjoint(...)
    except vlcc_adjoint.VlccError as e:   # anything the framework diagnosed
        ...

catches every diagnosed failure, while existing ``except ValueError`` or
``except RuntimeError`` clauses keep working.  This module imports nothing of
the package, so every layer (schedules first) can import it.
"""

from __future__ import annotations

__all__ = ["VlccError"]


class VlccError(Exception):
    """Base class of every exception vlcc-adjoint raises deliberately.

    Subclasses also derive from the builtin exception that describes the
    failure (``ValueError``, ``TypeError``, ``RuntimeError``, ...); catch
    ``VlccError`` to handle any of them, or the builtin to handle one kind.
    """
