"""Numba kernels that load numba on their first call, not at import, and
run as plain Python below a work budget.

``import numba`` and loading a kernel from numba's on-disk cache take a few
hundred milliseconds, and compiling one on a fresh install takes seconds;
small schedules are built and replayed faster in plain Python than that.  So
the schedule modules declare their kernels with :func:`njit`, which records
the function and numba's options and returns a :class:`LazyKernel`; numba is
imported, and the kernel compiled or loaded from the cache, when the kernel
is first called.

One description of each algorithm.  The plain-Python run of a kernel is the
kernel's own function (numba's ``py_func``), never a hand-written twin:
:meth:`LazyKernel.python` runs ``py_func`` with every kernel it calls run as
plain Python too (its globals, with each lazy kernel replaced by its
``py_func``, see :func:`python_function`), so a small schedule never imports
numba and the two runs cannot drift apart.  Kernels meant to run both ways
index their arguments element by element (no views, no array methods beyond
``len``), so the Python caller may hand them lists where indexing a numpy
array from the interpreter would cost a boxed scalar per access.

A kernel that calls another kernel names it as a global, which numba types
when it compiles the caller.  Numba types an object it does not know by its
``_numba_type_`` attribute, so :attr:`LazyKernel._numba_type_` builds the
callee's dispatcher on demand and answers with its type: a kernel compiled
by plain ``numba.njit`` may call a lazy one, and lazy ones call each other,
exactly as if all were numba dispatchers.  Module-level integer constants
(the action kinds of :mod:`.actions`) are frozen into the compiled code.

Which run is taken is a ski-rental decision (Karlin, Manasse, Rudolph &
Sleator, Algorithmica 3, 1988), made by :class:`PythonBudget`: loading the
kernel is the one-off purchase, each Python run the rent.  A module runs its
kernel's ``py_func`` while the work it did so in this process stays within a
budget priced at about the load cost, and the compiled kernel afterwards, or
at once for work larger than the budget, or when the kernel is loaded
already.  So no process pays much more than twice what it would with the
better of the two choices made in hindsight, and small schedules never
import numba.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

__all__ = ["LazyKernel", "PythonBudget", "load_kernels", "njit", "python_function"]

_lock = threading.Lock()
_KERNELS: list[LazyKernel] = []  # every kernel declared with njit, in declaration order


class LazyKernel:
    """A function that becomes ``numba.njit(**options)(py_func)`` on first use.

    **Attributes:**

    - `py_func`: the Python function (numba's name for it, too).
    - `options`: the keyword arguments for ``numba.njit``.
    """

    def __init__(self, py_func: Callable, options: dict):
        self.py_func = py_func
        self.options = options
        self._dispatcher = None
        self._python: types.FunctionType | None = None  # see python_function
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__doc__ = py_func.__doc__
        self.__module__ = py_func.__module__

    @property
    def dispatcher(self):
        """The numba dispatcher (imports numba the first time)."""
        if self._dispatcher is None:
            with _lock:
                if self._dispatcher is None:
                    import numba

                    self._dispatcher = numba.njit(**self.options)(self.py_func)
        return self._dispatcher

    @property
    def loaded(self) -> bool:
        """Whether the dispatcher exists (numba has been imported for it)."""
        return self._dispatcher is not None

    @property
    def _numba_type_(self):
        # How numba types this object when a compiled caller names it.
        return self.dispatcher._numba_type_

    def __call__(self, *args):
        return self.dispatcher(*args)

    def python(self, *args):
        """``py_func(*args)`` in plain Python, the kernels it calls included
        (never imports numba; see :func:`python_function`)."""
        return python_function(self)(*args)

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded"
        return f"<LazyKernel {self.__module__}.{self.__qualname__} ({state})>"


class PythonBudget:
    """How much work a module still runs in plain Python (see the module docstring).

    **Arguments:**

    - `limit`: the work (in the module's unit: steps, rows) that plain
      Python does in about the time numba and the kernel take to load.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.left = limit

    def take(self, work: int, kernel: LazyKernel) -> bool:
        """Whether to run `work` in Python (and if so, charge it)."""
        if kernel.loaded or work > self.left:
            return False
        self.left -= work
        return True


def python_function(kernel: LazyKernel) -> types.FunctionType:
    """The kernel's ``py_func`` with every lazy kernel among its globals
    replaced by that kernel's own Python function, recursively.

    The same code object and defaults as ``py_func``, over a copy of its
    module's globals taken at the first call (the constants and kernels a
    kernel names are bound once at import and never rebound), so a call from
    Python runs the whole call tree in the interpreter without a wrapper per
    nested call.  Built once per kernel and kept.
    """
    function = kernel._python
    if function is None:
        py_func = kernel.py_func
        names: dict[str, Any] = dict(py_func.__globals__)
        function = types.FunctionType(
            py_func.__code__, names, py_func.__name__, py_func.__defaults__, py_func.__closure__
        )
        kernel._python = function  # before the callees: kernels may call each other
        for name, value in names.items():
            if isinstance(value, LazyKernel):
                names[name] = python_function(value)
    return function


def njit(**options) -> Callable[[Callable], LazyKernel]:
    """``numba.njit(**options)``, deferred until the kernel is first called."""

    def wrap(func: Callable) -> LazyKernel:
        kernel = LazyKernel(func, options)
        _KERNELS.append(kernel)
        return kernel

    return wrap


def load_kernels() -> None:
    """Import numba and make every schedule kernel a numba dispatcher now.

    From then on the schedule modules run their compiled kernels at every
    size, never their ``py_func`` (each kernel compiles, or loads from
    numba's on-disk cache, at its first call).  For a process that builds
    many schedules and wants each build at the kernels' speed from the first
    one, and for timing the kernels; a process that builds a few small
    schedules is faster without (see the module docstring).
    """
    for kernel in list(_KERNELS):
        kernel.dispatcher  # noqa: B018
