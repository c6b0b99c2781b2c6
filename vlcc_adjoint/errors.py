"""The root of every error vlcc-adjoint raises on purpose, and retired names.

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

A module lists its retired names as ``{old name: (loader, replacement)}`` and
defines ``__getattr__ = deprecated_getattr(__name__, table)``: the name stays
importable (``from module import old`` calls the module's ``__getattr__``,
PEP 562), returns the very object it returned before, and warns
``DeprecationWarning`` naming what to use instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

__all__ = [
    "VlccError",
    "VlccFileNotFoundError",
    "VlccImportError",
    "VlccIndexError",
    "VlccKeyError",
    "VlccRuntimeError",
    "VlccTypeError",
    "VlccValueError",
    "deprecated_getattr",
]


class VlccError(Exception):
    """Base class of every exception vlcc-adjoint raises deliberately.

    Subclasses also derive from the builtin exception that describes the
    failure (``ValueError``, ``TypeError``, ``RuntimeError``, ...); catch
    ``VlccError`` to handle any of them, or the builtin to handle one kind.
    """


# The diagnosed failures that have no class of their own: each is the
# builtin a caller would expect (an argument of the wrong value is a
# ``ValueError``), and a ``VlccError``.


class VlccValueError(VlccError, ValueError):
    """An argument or a stored value is invalid; the message names it and the fix."""


class VlccTypeError(VlccError, TypeError):
    """An argument has the wrong type; the message names it and the fix."""


class VlccRuntimeError(VlccError, RuntimeError):
    """An operation cannot proceed in the present state (a closed store, a
    run that did not converge, a process in the wrong mode)."""


class VlccKeyError(VlccError, KeyError):
    """A record, version, ref or leaf that is asked for does not exist (or
    already exists, where a new one was to be made)."""


class VlccIndexError(VlccError, IndexError):
    """An index (an action of a schedule, a leaf of a version) is out of range."""


class VlccImportError(VlccError, ImportError):
    """An optional dependency that a feature needs is not installed; the
    message names the package to install."""


class VlccFileNotFoundError(VlccError, FileNotFoundError):
    """A path that should hold a checkpoint or a history does not exist."""


def deprecated_getattr(
    module: str, table: dict[str, tuple[Callable[[], Any], str]]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves the retired names in `table`.

    **Arguments:**

    - `module`: the module's ``__name__`` (for the messages).
    - `table`: old name -> (a function returning the object, the replacement
      to name in the warning).

    **Returns:** the ``__getattr__`` function; an unknown name raises
    ``AttributeError`` as usual.
    """

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        load, replacement = table[name]
        warnings.warn(
            f"{module}.{name} is deprecated; use {replacement}", DeprecationWarning, stacklevel=2
        )
        return load()

    return __getattr__
