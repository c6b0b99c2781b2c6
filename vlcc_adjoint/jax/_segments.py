"""Segments: a schedule over blocks of steps, each block reversed with its residuals kept.

An adjoint step of a schedule is the VJP of one forward step: it runs that
step forward once more, keeps its intermediates (the *residuals*) just long
enough, and runs the step's adjoint.  So a checkpointed scan of ``n`` steps
with ``c`` state slots costs

    t(n, c) + n  forward steps  +  n step adjoints,

with ``t(n, c) = r n - C(c + r, c + 1)`` Griewank's optimal forward count
(``r`` the least integer with ``C(c + r, c) >= n``), and holds ``c`` states
plus one step's residuals.

With ``segment=B`` the schedule runs over ``m = n // B`` *segments*: segment
``j`` maps ``u_{jB}`` to ``u_{(j+1)B}`` by a ``lax.scan`` of ``B`` steps, and
the schedule's adjoint step of segment ``j`` is the VJP of that scan, which
runs the ``B`` steps forward once keeping all their residuals and then their
adjoints.  The ``n - m B`` trailing steps form one more segment, a
``jax.checkpoint``-ed ``lax.scan`` after the others.  The cost becomes

    B t(m, c') + (n - m B) + n  forward steps  +  n step adjoints,

holding ``c'`` states plus ``B`` steps' residuals.  ``t`` grows with the
repetition number ``r``, which falls as the number of reversals (``m``)
falls: residual memory buys fewer recomputations.  With ``c' >= m`` this is
two-level nested checkpointing ("nested remat": a scan of checkpointed
scans, Griewank and Walther 2008, Sec. 12.4), with fewer slots a Revolve
schedule over the segments.

``segment="auto"`` chooses ``B`` and ``c'`` within the memory that
``segment=1`` with ``c`` slots uses, ``c S + R`` for state bytes ``S`` and
one step's residual bytes ``R``: the ``B`` minimising the forward count
above subject to ``c' S + B R <= c S + R`` (ties: the smaller ``B``).  ``R``
is measured, not guessed: the residuals that ``jax.vjp`` of a ``lax.scan``
of the step keeps, for three steps minus for two (loop-invariant residuals,
such as a product of parameters, are kept once and cancel).

**References:** A. Griewank and A. Walther, Algorithm 799: revolve, ACM TOMS
26(1), 2000; A. Griewank and A. Walther, Evaluating Derivatives, 2nd ed.,
SIAM 2008, Ch. 12.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import VlccTypeError, VlccValueError
from ..schedules import binomial_forward_count
from ._interpret import Step, scan_leaves
from ._state import leaf_nbytes

__all__ = [
    "check_segment",
    "choose_segment",
    "residual_bytes",
    "segmented_forward_count",
    "segmented_scan",
    "tree_nbytes",
]

#: The longest segment the automatic choice considers.
MAX_SEGMENT = 4096


def tree_nbytes(tree: Any) -> int:
    """The bytes of the arrays (or abstract values: tracers,
    ``jax.ShapeDtypeStruct``) in the pytree `tree`, from their shapes and
    dtypes (PRNG keys: their ``key_data``): nothing is computed or
    transferred."""
    return sum(leaf_nbytes(x) for x in jax.tree.leaves(tree))


def residual_bytes(step: Step, init_leaves, xs_leaves, consts) -> int:
    """Bytes of residuals that reverse mode keeps per step of ``lax.scan(step)``.

    **Arguments:** `step` on flat leaves
    (:data:`~vlcc_adjoint.jax._interpret.Step`); the carry's leaves,
    the per-step inputs (with their leading axis) and the closure's arrays.

    **Returns:** the residual bytes of a three-step scan minus those of a
    two-step scan (traced with ``jax.eval_shape``: nothing runs).
    """
    shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in init_leaves]
    consts_s = [jax.ShapeDtypeStruct(jnp.shape(k), jnp.result_type(k)) for k in consts]

    def kept(length):
        xs_s = [
            jax.ShapeDtypeStruct((length,) + tuple(jnp.shape(x))[1:], jnp.result_type(x))
            for x in xs_leaves
        ]

        def run(c, xs, k):
            return scan_leaves(step, c, xs, k, length)

        def pullback(c, xs, k):
            diff = [_inexact(v) for v in (*c, *k)]
            if not any(diff):
                return []
            return jax.vjp(run, c, xs, k)[1]

        return tree_nbytes(jax.eval_shape(pullback, shapes, xs_s, consts_s))

    return max(0, kept(3) - kept(2))


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def segmented_forward_count(n: int, segment: int, slots: int) -> int:
    """Forward steps outside adjoint steps with `segment`-step segments and
    `slots` state slots (the module docstring's ``B t(m, c') + (n - m B)``)."""
    m = n // segment
    head = segment * binomial_forward_count(m, min(slots, m)) if m > 0 else 0
    return head + (n - m * segment)


def choose_segment(n: int, slots: int, state_bytes: int, residual: int) -> tuple[int, int]:
    """The automatic ``(segment, slots)`` within ``slots * state_bytes + residual`` bytes.

    **Returns:** the segment length ``B`` and the state slots ``c'`` that
    minimise :func:`segmented_forward_count` subject to ``c' S + B R <= c S
    + R`` (``B = 1``, ``c' = c`` is always feasible); a ``B`` that divides
    ``n`` (no tail segment to compile) is preferred within 5% of the least
    count.
    """
    budget = slots * state_bytes + residual
    best = (segmented_forward_count(n, 1, slots), 1, slots)
    best_divisor = best
    for b in range(2, min(n, MAX_SEGMENT) + 1):
        free = budget - b * residual
        c = free // state_bytes if state_bytes else slots
        if c < 1:
            break
        m = n // b
        c = int(min(c, max(m, 1)))
        cost = segmented_forward_count(n, b, c)
        if cost < best[0]:
            best = (cost, b, c)
        if n % b == 0 and cost < best_divisor[0]:
            best_divisor = (cost, b, c)
    # A segment length that divides n needs no tail segment (one loop body
    # fewer to compile): preferred when it costs at most 5% more.
    if best_divisor[0] <= 1.05 * best[0]:
        best = best_divisor
    return best[1], best[2]


def segmented_scan(
    scan: Callable,
    f: Callable,
    init,
    xs,
    n: int,
    segment: int,
    *,
    schedule,
    snapshots,
    store,
    unroll: int,
):
    """``scan(f, init, xs, n)`` as a checkpointed scan over `segment`-step segments.

    `scan` is ``checkpointed_scan`` (passed in to keep the modules one-way);
    the schedule (or `snapshots`) is for the ``n // segment`` segments.
    """
    m, tail = divmod(n, segment)

    def block(c, xb):
        return lax.scan(f, c, xb, length=segment, unroll=unroll)

    head_xs = (
        None
        if xs is None
        else jax.tree.map(
            lambda x: jnp.asarray(x)[: m * segment].reshape((m, segment) + jnp.shape(x)[1:]), xs
        )
    )
    carry, ys = scan(block, init, head_xs, m, schedule=schedule, snapshots=snapshots, store=store)
    ys = jax.tree.map(lambda y: y.reshape((m * segment,) + y.shape[2:]), ys)
    if tail:
        tail_xs = None if xs is None else jax.tree.map(lambda x: jnp.asarray(x)[m * segment :], xs)
        carry, ys_tail = jax.checkpoint(
            lambda c, xt: lax.scan(f, c, xt, length=tail, unroll=unroll)
        )(carry, tail_xs)
        ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, ys_tail)
    return carry, ys


def check_segment(segment, n: int, schedule) -> int | str:
    """Validate the `segment` argument of ``checkpointed_scan``."""
    if isinstance(segment, str):
        if segment != "auto":
            raise VlccValueError(
                f"checkpointed_scan: `segment` must be a positive int or 'auto', got {segment!r}"
            )
        if schedule is not None:
            raise VlccValueError(
                "checkpointed_scan: segment='auto' chooses the slots itself; with a `schedule` "
                "give segment=B, an int, and a schedule for length // B segments"
            )
        return segment
    if isinstance(segment, bool) or not isinstance(segment, (int, np.integer)):
        raise VlccTypeError(
            f"checkpointed_scan: `segment` must be a Python int or 'auto', got {segment!r}"
        )
    segment = int(segment)
    if segment < 1:
        raise VlccValueError(f"checkpointed_scan: `segment` must be >= 1, got {segment}")
    if segment > n:
        raise VlccValueError(
            f"checkpointed_scan: `segment`={segment} is longer than the scan ({n} steps); "
            f"give segment <= {n}"
        )
    if schedule is not None and schedule.n_steps != n // segment:
        raise VlccValueError(
            f"checkpointed_scan: with segment={segment} the schedule runs over the "
            f"{n // segment} segments of the {n}-step scan, but it is for {schedule.n_steps}; "
            f"build it for {n // segment}, e.g. {type(schedule).__name__}({n // segment}, ...)"
        )
    return segment
