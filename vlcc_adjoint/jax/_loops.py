"""Conveniences over :func:`checkpointed_scan`: a step decorator and a fori_loop."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

from ..schedules import Schedule
from ._options import static_int
from ._scan import checkpointed_scan

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["CheckpointedStep", "checkpointed", "checkpointed_fori_loop"]


class CheckpointedStep:
    """A step function ``f(carry, x) -> (carry, y)`` with a checkpointed loop.

    Calling it runs one step (``f`` itself); :meth:`scan` runs
    :func:`checkpointed_scan` over it.  Made by :func:`checkpointed`.
    """

    def __init__(self, f: Callable, **options: Any):
        self.f = f
        self.options = options
        functools.update_wrapper(self, f)

    def __call__(self, carry: Any, x: Any = None) -> tuple[Any, Any]:
        return self.f(carry, x)

    def scan(self, init: Any, xs: Any = None, length: int | None = None) -> tuple[Any, Any]:
        """``checkpointed_scan(f, init, xs, length, **options)``."""
        return checkpointed_scan(self.f, init, xs, length, **self.options)


def checkpointed(
    f: Callable | None = None,
    *,
    schedule: Schedule | None = None,
    snapshots: int | None = None,
    store: TieredStore | None = None,
    unroll: int = 1,
    segment: int | str = 1,
) -> CheckpointedStep | Callable[[Callable], CheckpointedStep]:
    """Decorate a step function ``f(carry, x) -> (carry, y)`` for checkpointed loops.

    ::

        @checkpointed(snapshots=10)
        def step(u, x):
            return u + dt * rhs(u, x), None

        u_n, _ = step.scan(u_0, xs)      # == checkpointed_scan(step, u_0, xs, snapshots=10)

    The decorated object still runs one step when called.  **Arguments:** as
    :func:`checkpointed_scan`.  **Returns:** a :class:`CheckpointedStep`.
    """
    options = dict(
        schedule=schedule, snapshots=snapshots, store=store, unroll=unroll, segment=segment
    )
    if f is None:
        return lambda g: CheckpointedStep(g, **options)
    return CheckpointedStep(f, **options)


def checkpointed_fori_loop(
    lower: int,
    upper: int,
    body_fun: Callable,
    init_val: Any,
    *,
    schedule: Schedule | None = None,
    snapshots: int | None = None,
    store: TieredStore | None = None,
    unroll: int = 1,
    segment: int | str = 1,
) -> Any:
    """``jax.lax.fori_loop`` whose reverse mode follows a checkpoint schedule.

    ``body_fun(i, val) -> val`` for ``i = lower .. upper - 1``; `lower` and
    `upper` must be Python ints (the step count sizes the schedule).  The
    loop index travels in the carry, so it is checkpointed with the state.

    **Arguments:** as :func:`jax.lax.fori_loop`, plus `schedule`,
    `snapshots`, `store`, `unroll` as :func:`checkpointed_scan` (the
    schedule is for ``upper - lower`` steps).  **Returns:** the final value.
    """
    remedy = "use jax.lax.fori_loop for traced bounds, or make the bounds static"
    lower = static_int(lower, "lower", remedy, caller="checkpointed_fori_loop")
    upper = static_int(upper, "upper", remedy, caller="checkpointed_fori_loop")
    if upper <= lower:
        return init_val

    def f(carry, _):
        i, val = carry
        return (i + 1, body_fun(i, val)), None

    (_, val), _ = checkpointed_scan(
        f,
        (jnp.asarray(lower, jnp.int32), init_val),
        None,
        upper - lower,
        schedule=schedule,
        snapshots=snapshots,
        store=store,
        unroll=unroll,
        segment=segment,
    )
    return val
