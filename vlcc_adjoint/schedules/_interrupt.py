"""Calling a numba kernel so that Ctrl-C is a clean ``KeyboardInterrupt``.

A compiled kernel runs without the interpreter: a SIGINT that arrives
meanwhile only sets a flag, and the interpreter runs the Python handler (the
one that raises ``KeyboardInterrupt``) at the next chance it gets.  When the
kernel returns a tuple of arrays, that chance comes while numba converts the
result to Python objects; the ``KeyboardInterrupt`` raised there makes one
conversion fail, numba puts the missing item into the tuple anyway, and
unpacking it dereferences a null pointer (a segmentation fault), or numba
reports a ``SystemError`` ("returned a result with an exception set").

So the kernel runs on a worker thread, where the interpreter never runs
signal handlers, and the main thread waits for it in ``Thread.join``, which
a signal interrupts.  On ``KeyboardInterrupt`` the main thread sets the
kernel's `stop` flag (a one-element array the kernel polls between units of
work) when it has one, waits for the kernel to return, which it then soon
does, and re-raises: the kernel is never abandoned mid-flight, its memory is
never freed under it, and no thread outlives the call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

__all__ = ["call_kernel", "stop_flag"]


def stop_flag() -> np.ndarray:
    """A zeroed one-element flag for a kernel to poll (``stop[0] != 0``: return early)."""
    return np.zeros(1, np.int64)


def call_kernel(kernel: Callable, *args, stop: np.ndarray | None = None, threaded: bool = True):
    """``kernel(*args)``, with Ctrl-C turned into a clean ``KeyboardInterrupt``.

    **Arguments:**

    - `kernel`: a numba-compiled function (``nogil=True``, so that the
      waiting thread gets the interpreter while it runs).
    - `args`: its arguments.
    - `stop`: the flag `kernel` polls, if it has one (:func:`stop_flag`);
      without one, an interrupt waits for the kernel to finish.
    - `threaded`: ``False`` calls `kernel` directly, for work too short for
      an interrupt to matter (a thread costs some tens of microseconds).

    **Returns:** what `kernel` returns.

    **Raises:** ``KeyboardInterrupt`` once the kernel has returned, if one
    arrived meanwhile; whatever `kernel` raised.
    """
    if not threaded or threading.current_thread() is not threading.main_thread():
        # Only the main thread runs signal handlers: nothing to guard against.
        return kernel(*args)
    outcome: list = []

    def work():
        try:
            outcome.append((True, kernel(*args)))
        except BaseException as error:  # handed to the caller below
            outcome.append((False, error))

    worker = threading.Thread(
        target=work, name=f"vlcc-{getattr(kernel, '__name__', 'kernel')}", daemon=True
    )
    worker.start()
    interrupt = None
    while worker.is_alive():
        try:
            worker.join()
        except KeyboardInterrupt as error:
            # The first interrupt is the one raised; later ones only repeat it
            # while the kernel winds down.
            interrupt = interrupt or error
            if stop is not None:
                stop[0] = 1
    if interrupt is not None:
        raise interrupt
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
