"""The static options of :func:`~vlcc_adjoint.jax.checkpointed_scan`, checked once.

``lax.scan`` takes its length and ``unroll`` as Python ints; a checkpointed
scan adds options that size device buffers and choose the compiled program
(``schedule`` or ``snapshots``, ``segment``), so they must be known at trace
time too.  Each check here names the option, what it got and the fix, and
raises a :class:`~vlcc_adjoint.errors.VlccError` (``TypeError`` or
``ValueError`` subclasses, as ``lax.scan`` raises for its own arguments).
The checkpointed loops of :mod:`._loops` check their bounds with the same
:func:`static_int`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..errors import VlccTypeError, VlccValueError
from ..schedules import Revolve, Schedule, default_snapshots
from ._program import Program, compile_program

__all__ = [
    "check_schedule",
    "check_unroll",
    "is_tracer",
    "resolve_program",
    "scan_length",
    "slot_count",
    "static_int",
]


def is_tracer(x: Any) -> bool:
    """Whether `x` is a JAX tracer (a value known only at run time)."""
    return isinstance(x, jax.core.Tracer)


def static_int(value: Any, name: str, remedy: str, caller: str = "checkpointed_scan") -> int:
    """`value` as a Python int, or a ``TypeError`` naming `name` and `remedy`
    when it is traced, a bool or not an integer.

    **Arguments:** `value`; `name`, the option's name; `remedy`, what to
    do when it is traced; `caller`, the function named in the message.
    """
    if is_tracer(value):
        raise VlccTypeError(
            f"{caller}: `{name}` must be a Python int known at trace time, "
            f"got a traced value {value!r}; {remedy}"
        )
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VlccTypeError(f"{caller}: `{name}` must be an int, got {value!r}")
    return int(value)


def check_unroll(unroll: Any) -> int:
    """``lax.scan``'s `unroll`: a non-negative int or a bool, returned as
    an int with ``0`` for "fully" (``True`` and ``0`` unroll the whole
    loop, ``False`` is ``1``), as ``lax.scan`` reads it."""
    if isinstance(unroll, bool):
        return 0 if unroll else 1
    unroll = static_int(unroll, "unroll", "give a Python int or bool")
    if unroll < 0:
        raise VlccValueError(
            f"checkpointed_scan: `unroll` must be a bool or a non-negative int "
            f"(0 or True: fully), got {unroll}"
        )
    return unroll


def scan_length(xs_leaves: Sequence[Any], length: Any) -> int:
    """The number of steps: `length`, or the leading axis of every leaf of
    `xs` (they must agree)."""
    if length is not None:
        length = static_int(
            length,
            "length",
            "the number of steps must be static (mark it static in jax.jit with "
            "static_argnums, or derive it from xs)",
        )
        if length < 0:
            raise VlccValueError(f"checkpointed_scan: `length` must be >= 0, got {length}")
    lengths = set()
    for leaf in xs_leaves:
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise VlccValueError(
                "checkpointed_scan: every leaf of `xs` needs a leading axis to scan "
                f"over, got a scalar {leaf!r}; give it shape (length, ...)"
            )
        lengths.add(shape[0])
    if len(lengths) > 1:
        raise VlccValueError(
            "checkpointed_scan: the leaves of `xs` have different leading axis sizes "
            f"{sorted(lengths)}; they must all equal the number of steps"
        )
    if lengths:
        (xs_length,) = lengths
        if length is not None and length != xs_length:
            raise VlccValueError(
                f"checkpointed_scan: `length`={length} but the leaves of `xs` have "
                f"leading axis {xs_length}; pass length={xs_length} or drop `length`"
            )
        length = xs_length
    if length is None:
        raise VlccValueError("checkpointed_scan: with xs=None give `length`, the number of steps")
    return int(length)


def slot_count(n: int, snapshots: Any) -> int:
    """`snapshots` checked as a static int >= 1 (``None``: the default,
    :func:`~vlcc_adjoint.schedules.default_snapshots` with two repetitions)."""
    if snapshots is None:
        snapshots = default_snapshots(n, repetitions=2)
    snapshots = static_int(
        snapshots,
        "snapshots",
        "the number of checkpoint slots sizes a device buffer, so it must be static "
        "(mark it static in jax.jit with static_argnames)",
    )
    if snapshots < 1:
        raise VlccValueError(f"checkpointed_scan: `snapshots` must be >= 1, got {snapshots}")
    return snapshots


def check_schedule(schedule: Any, snapshots: Any) -> Schedule | None:
    """`schedule` checked as a static :class:`~vlcc_adjoint.schedules.Schedule`
    with a table (or ``None``), and not given together with `snapshots`."""
    if schedule is None:
        return None
    if snapshots is not None:
        raise VlccValueError(
            "checkpointed_scan: give `schedule` or `snapshots`, not both "
            "(`snapshots=c` means schedule=Revolve(length, c))"
        )
    if is_tracer(schedule) or not isinstance(schedule, Schedule):
        raise VlccTypeError(
            "checkpointed_scan: `schedule` must be a vlcc_adjoint.schedules.Schedule "
            f"(static data built outside the traced function), got {type(schedule).__name__}; "
            "e.g. schedule=Revolve(length, snapshots)"
        )
    if not hasattr(schedule, "table"):  # builds the table of a schedule that has one
        raise VlccValueError(
            f"checkpointed_scan: this {type(schedule).__name__} schedule has no table yet; an "
            "Online schedule used with scan knows its length: give Online(length, snapshots=c)"
        )
    return schedule


@functools.lru_cache(maxsize=64)
def _revolve_program(n: int, snapshots: int) -> Program:
    return compile_program(Revolve(n, snapshots))


def resolve_program(n: int, schedule: Any, snapshots: Any, host: bool = False) -> Program:
    """The compiled program of the scan's schedule: `schedule` (checked to
    be for `n` steps; `host`: whether it may use levels >= 1), or
    ``Revolve(n, snapshots)`` (cached per ``(n, snapshots)``)."""
    schedule = check_schedule(schedule, snapshots)
    if schedule is None:
        return _revolve_program(n, slot_count(n, snapshots))
    if schedule.n_steps != n:
        raise VlccValueError(
            f"checkpointed_scan: the schedule is for {schedule.n_steps} steps but the "
            f"scan has length {n}; build it for this length, e.g. "
            f"{type(schedule).__name__}({n}, ...)"
        )
    return compile_program(schedule, host=host)
