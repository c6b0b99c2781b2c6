"""The callback protocol between a time-stepping solver and the executor.

A solver advances a state one step forward and one adjoint step backward;
:func:`vlcc_adjoint.execute.run_adjoint` decides, from a schedule, when each
is called and which states are stored, restored or recomputed.

Conventions (DESIGN.md section 3): states ``u_0 .. u_n``; ``forward(u_i, i)``
returns ``u_{i+1}``; ``adjoint(u_i, lambda_{i+1}, i)`` returns
``lambda_i``.  For an objective ``J = sum_i j_i(u_i) + j_n(u_n)`` the
discrete adjoint recursion is

    lambda_n = dj_n/du_n,
    lambda_i = (d u_{i+1} / d u_i)^T lambda_{i+1} + dj_i/du_i,

so a loss injected at every step (a seismic receiver misfit summed over
time) is the ``+ dj_i/du_i`` term added inside ``adjoint``.  Gradients with
respect to parameters ``m`` (a velocity model, a viscosity) are the sum over
steps of ``(d u_{i+1} / d m)^T lambda_{i+1}``: the solver accumulates them in
an attribute of its own during the adjoint steps (see
``examples/seismic_fwi.py``).

A solver is any object with ``forward`` and ``adjoint`` methods
(:class:`Solver`); the optional members below let it go faster or keep its
own memory layout.  :func:`timestep` makes one from plain functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .errors import VlccTypeError

__all__ = ["Solver", "TimestepSolver", "timestep"]

State = Any
_DECORATOR = object()  # marks ``@step.adjoint`` use


@runtime_checkable
class Solver(Protocol):
    """What :func:`~vlcc_adjoint.execute.run_adjoint` needs from a solver.

    **Required:**

    - `forward(state, step) -> state`: ``u_step -> u_{step+1}``.  It may
      update ``state`` in place and return it.
    - `adjoint(state, adj, step) -> adj`: ``lambda_{step+1} -> lambda_step``
      with ``u_step = state`` in hand; it may update ``adj`` in place, and
      may consume ``state`` (the executor never reads it again).

    **Optional** (looked up with ``getattr``; absent means the default):

    - `forward_many(state, start, stop) -> state`: advance ``u_start ->
      u_stop`` in bulk (a compiled time loop, an operator applied over a time
      range as in Devito).  Default: ``forward`` step by step.
    - `copy(state) -> state`: an independent copy; used for the final state
      returned to the caller.  Default: the store's copy.
    - `on_save(state, step) -> state`: the part of the state worth storing
      (strip halos, drop derived fields).  Default: identity.
    - `on_load(stored, step, out) -> state`: rebuild the solver's state
      from what ``on_save`` kept; ``out`` is the state object in hand, or
      ``None``.  ``stored`` holds read-only views of the stored record:
      copy what you keep (into ``out``'s buffers, typically).  Default:
      ``stored``.
    - `restore_in_place: bool`: if true, restored states are copied into
      the arrays of the state in hand instead of fresh ones (the solver owns
      its buffers and advances them in place).  Default ``False``.
    """

    def forward(self, state: State, step: int) -> State: ...

    def adjoint(self, state: State, adj: State, step: int) -> State: ...


class TimestepSolver:
    """A :class:`Solver` made of plain functions; built by :func:`timestep`.

    Calling it runs one forward step, so the decorated function keeps
    working as before.
    """

    def __init__(
        self,
        step: Callable[[State, int], State],
        adjoint: Callable[[State, State, int], State] | None = None,
        forward_many: Callable[[State, int, int], State] | None = None,
        restore_in_place: bool = False,
    ):
        if not callable(step):
            raise VlccTypeError(f"timestep needs a step function step(state, i), got {step!r}")
        self._step = step
        self._adjoint = adjoint
        if forward_many is not None:
            self.forward_many = forward_many
        self.restore_in_place = restore_in_place
        self.__name__ = getattr(step, "__name__", "timestep")
        self.__doc__ = getattr(step, "__doc__", None)
        self.__wrapped__ = step

    def __call__(self, state: State, step: int) -> State:
        return self._step(state, step)

    def forward(self, state: State, step: int) -> State:
        return self._step(state, step)

    def adjoint(self, state: Any, adj: Any = _DECORATOR, step: Any = _DECORATOR) -> Any:
        """The adjoint step ``adjoint(state, adj, i) -> adj``.

        Called with one function instead, ``@step.adjoint`` declares it.
        """
        if adj is _DECORATOR and step is _DECORATOR:
            return self.define_adjoint(state)
        if self._adjoint is None:
            raise VlccTypeError(
                f"timestep {self.__name__!r} has no adjoint; declare one with "
                f"@{self.__name__}.adjoint on a function adjoint(state, adj, i) -> adj"
            )
        return self._adjoint(state, adj, step)

    def define_adjoint(self, fn: Callable[[State, State, int], State]) -> Callable:
        """Declare the adjoint step (``@step.adjoint`` is the same)."""
        if not callable(fn):
            raise VlccTypeError(
                f"the adjoint must be a function adjoint(state, adj, i), got {fn!r}"
            )
        self._adjoint = fn
        return fn

    def __repr__(self) -> str:
        has = "with" if self._adjoint is not None else "without"
        return f"<timestep {self.__name__} {has} adjoint>"


def timestep(
    step: Callable | None = None,
    *,
    adjoint: Callable | None = None,
    forward_many: Callable | None = None,
    restore_in_place: bool = False,
) -> TimestepSolver | Callable[[Callable], TimestepSolver]:
    """Turn a plain step function into a :class:`Solver`.

    **Arguments:**

    - `step`: ``step(state, i) -> state``, the forward step ``u_i -> u_{i+1}``.
    - `adjoint`: ``adjoint(state, adj, i) -> adj``; or declare it later
      with the ``@step.adjoint`` decorator.
    - `forward_many`, `restore_in_place`: see :class:`Solver`.

    **Returns:** a :class:`TimestepSolver` (callable like `step`).

    Example::

        @timestep
        def step(u, i):
            return u + dt * f(u)

        @step.adjoint
        def step_adjoint(u, lam, i):
            return lam + dt * df(u).T @ lam
    """

    def wrap(fn):
        return TimestepSolver(
            fn, adjoint=adjoint, forward_many=forward_many, restore_in_place=restore_in_place
        )

    if step is None:
        return wrap
    return wrap(step)
