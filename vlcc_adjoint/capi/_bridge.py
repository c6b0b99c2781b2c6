"""What ``libvlcc`` calls: the Python side of every function of ``vlcc.h``.

The C library (``vlcc.c``) is a thin layer: it starts the interpreter when
the program has not, checks its arguments for what C alone can check (NULL
pointers, handles), and calls, holding the GIL for the call only:

======================================  ========================================
C                                       Python
======================================  ========================================
``vlcc_run_open(&run, config)``         ``open_run(config)`` -> a :class:`Run`
``vlcc_run_protect(run, ...)``          ``run.protect(name, address, dtype, shape)``
``vlcc_run_next(run, &action)``         ``next(rows)``, ``rows = run.actions()``
``vlcc_run_close(run)``                 ``run.close()``
``vlcc_history_open(&h, path, mode)``   ``open_history(path, mode)``
``vlcc_history_protect(h, ...)``        ``h.protect(name, address, dtype, shape)``
``vlcc_history_commit(h, ...)``         ``h.commit(branch, message, size)``
``vlcc_history_checkout(h, ref)``       ``h.checkout(ref)``
``vlcc_history_close(h)``               ``h.close()``
(any exception)                         ``error(exc)`` -> ``(code, message)``
======================================  ========================================
"""

from __future__ import annotations

from ..storage import CorruptCheckpointError, StorageError
from ._header import constant
from ._history import RegionHistory
from ._run import CallOrderError, Run

__all__ = ["error", "open_history", "open_run"]


def open_run(config_json: str) -> Run:
    """The run ``vlcc_run_open`` opens (see :mod:`vlcc_adjoint.capi._config`)."""
    return Run.open(config_json)


def open_history(path: str, mode: str) -> RegionHistory:
    """The history ``vlcc_history_open`` opens."""
    return RegionHistory(path, mode)


def error(exc: BaseException) -> tuple[int, str]:
    """The return code (``vlcc.h``'s ``VLCC_E_...``) and the message of a
    call that raised `exc`: ``"TypeName: message"``, then its notes."""
    if isinstance(exc, CallOrderError):
        code = "VLCC_E_STATE"
    elif isinstance(exc, CorruptCheckpointError):
        code = "VLCC_E_CORRUPT"
    elif isinstance(exc, (StorageError, OSError)):
        code = "VLCC_E_STORAGE"
    elif isinstance(exc, ImportError):
        code = "VLCC_E_PYTHON"
    elif isinstance(exc, (ValueError, TypeError, KeyError, IndexError)):
        code = "VLCC_E_ARGUMENT"
    else:
        code = "VLCC_E_INTERNAL"
    text = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
    lines = [f"{type(exc).__name__}: {text}" if text else type(exc).__name__]
    lines += [str(note) for note in getattr(exc, "__notes__", ())]
    return constant(code), "\n".join(lines)
