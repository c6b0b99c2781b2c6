"""``checkpointed_scan``: ``jax.lax.scan`` whose reverse mode follows a schedule.

How it is put together.

1. ``f`` is closure-converted once (``jax.closure_convert``): its Python body
   runs exactly once, to a jaxpr, and every later use (the plain scan, the
   forward sweep, each VJP) evaluates that jaxpr.  Closed-over arrays that
   may carry a derivative (floating-point tracers of an enclosing
   ``jax.grad`` / ``jax.jit``) become explicit arguments, so gradients flow
   to closed-over parameters without a ``params`` argument.
2. The schedule is compiled at trace time into a static integer program
   (:mod:`._program`), run by two compiled loops (:mod:`._interpret`).
3. A ``jax.custom_vjp`` (with symbolic zeros, so it knows statically which
   inputs need a cotangent and which output cotangents are zero) ties them
   together:

   * primal (no differentiation): a plain ``lax.scan`` of ``f``; nothing
     stored;
   * forward rule: the schedule's forward sweep, which computes ``ys``,
     captures the schedule's checkpoints into a device buffer of its level-0
     slots plus one row for the state in hand, and stops where the backward
     pass starts (holding ``u_{n-1}``, or ``u_n`` for sweeps that run to the
     end); one more step gives ``u_n`` when needed.  Residuals: the buffer,
     ``xs`` and the closure's arrays, nothing per step;
   * backward rule: the rest of the program.  ``Reverse(i)`` is the VJP of
     ``f`` at ``(u_i, xs[i])`` applied to ``(lambda_{i+1}, ys_bar[i])``: the
     cotangent of ``y_i`` enters exactly at the adjoint step that owns it.

Other modes.  ``jax.jvp`` of a ``custom_vjp`` is refused by JAX, so a call
whose inputs are forward-mode tracers (``jax.jvp``, ``jax.jacfwd``) is a
plain ``lax.scan`` (forward mode stores nothing per step).  The schedule's
loops are while loops, which JAX cannot differentiate in reverse mode; when
the forward rule is itself being differentiated (its inputs are JVP or
linearize tracers: ``jax.grad`` of ``jax.grad``, ``jax.hessian``) it runs a
plain ``lax.scan`` and the backward rule is the VJP of ``lax.scan`` of the
``jax.checkpoint``-ed step: differentiable to any order, storing one carry
per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.tree_util import tree_flatten, tree_unflatten

from ..errors import VlccTypeError, VlccValueError
from ..schedules import Schedule
from ._host import HostSession
from ._interpret import Interpreter, index_rows, scan_leaves, update_rows
from ._options import check_schedule, check_unroll, resolve_program, scan_length, slot_count
from ._program import SPLIT_AT_REVERSE, Program
from ._segments import (
    check_segment,
    choose_segment,
    residual_bytes,
    segmented_scan,
    tree_nbytes,
)

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["checkpointed_scan"]


def _batched(x) -> bool:
    """Whether `x` is (or wraps) a ``jax.vmap`` tracer (a best-effort walk)."""
    seen = 0
    while isinstance(x, jax.core.Tracer) and seen < 32:
        if type(x).__name__ == "BatchTracer":
            return True
        x = getattr(x, "primal", getattr(x, "val", None))
        seen += 1
    return False


def _tracer_kinds(x) -> list[str]:
    """The tracer types `x` is wrapped in, outermost first (a best-effort walk)."""
    kinds: list[str] = []
    while isinstance(x, jax.core.Tracer) and len(kinds) < 32:
        kinds.append(type(x).__name__)
        x = getattr(x, "primal", getattr(x, "val", None))
    return kinds


def _differentiated(leaves) -> bool:
    """Whether any of `leaves` carries a derivative of an enclosing ``jax.jvp``
    / ``jax.grad`` (inside a custom_vjp rule: a higher-order derivative)."""
    return any(k in ("JVPTracer", "LinearizeTracer") for x in leaves for k in _tracer_kinds(x))


def _forward_mode(leaves) -> bool:
    """Whether `leaves` are differentiated in forward mode only (``jax.jvp``,
    ``jax.jacfwd``, possibly around ``jax.vmap``), with no reverse mode
    (``jax.grad`` / ``jax.vjp`` linearize) inside it."""
    kinds = {k for x in leaves for k in _tracer_kinds(x)}
    return "JVPTracer" in kinds and "LinearizeTracer" not in kinds


def _strip_weak(x):
    """``x`` as a JAX array of its own dtype, not weakly typed."""
    x = jnp.asarray(x)
    return lax.convert_element_type(x, x.dtype) if getattr(x, "weak_type", False) else x


def _inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _describe(path) -> str:
    return "carry" + jax.tree_util.keystr(path)


def _check_carry(init, carry_out) -> None:
    in_tree: Any  # a PyTreeDef (jaxlib ships no type stubs for it)
    in_leaves, in_tree = jax.tree_util.tree_flatten_with_path(init)
    out_leaves, out_tree = tree_flatten(carry_out)
    if in_tree != out_tree:
        raise VlccTypeError(
            "checkpointed_scan: f must return a carry with the structure of `init`; "
            f"init is {in_tree} but f returns {out_tree}. Return (new_carry, y) with "
            "new_carry built like init"
        )
    for (path, x), o in zip(in_leaves, out_leaves):
        if jnp.shape(x) != o.shape or jnp.result_type(x) != o.dtype:
            raise VlccTypeError(
                f"checkpointed_scan: f changes {_describe(path)} from "
                f"{jnp.result_type(x).name}{list(jnp.shape(x))} to {o.dtype.name}{list(o.shape)}; "
                "the carry must keep its shapes and dtypes across steps (cast with "
                ".astype(...) or reshape inside f, or give `init` the type f returns)"
            )


# ---------------------------------------------------------------------------
# A pytree node with no leaves, to pass static data through residuals.


@jax.tree_util.register_static
class _Static:
    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return hash(id(self))

    def __eq__(self, other):
        return self is other


# ---------------------------------------------------------------------------
# The scan


def checkpointed_scan(
    f: Callable,
    init: Any,
    xs: Any = None,
    length: int | None = None,
    *,
    schedule: Schedule | None = None,
    snapshots: int | None = None,
    store: TieredStore | None = None,
    unroll: int | bool = 1,
    reverse: bool = False,
    segment: int | str = 1,
) -> tuple[Any, Any]:
    """``jax.lax.scan`` whose reverse mode recomputes from a checkpoint schedule.

    Same signature and results as ``jax.lax.scan(f, init, xs, length,
    reverse=..., unroll=...)``: ``f(carry, x) -> (carry, y)``, returns
    ``(final_carry, ys)`` with ``ys`` stacked along a leading axis (``length
    = 0`` returns `init` and empty ``ys``).  Usable under ``jax.jit`` and
    ``jax.vmap``.  Without differentiation it is a plain ``lax.scan``.

    Differentiation.  Reverse mode (``jax.grad``, ``jax.vjp``) follows the
    schedule.  Forward mode (``jax.jvp``, ``jax.jacfwd``) is ``lax.scan``'s
    own: it stores nothing per step.  Second order (``jax.grad`` of
    ``jax.grad``, ``jax.hessian``): the first-order pass is then
    differentiated itself, and a schedule's while loops cannot be; the scan
    then runs as ``lax.scan`` of a ``jax.checkpoint``-ed step, whose reverse
    mode stores one carry per step (``n`` states, not the schedule's slots)
    and recomputes each step's intermediates.  ``jax.linearize`` traces
    like reverse mode (JAX cannot tell them apart), and JAX refuses to
    apply its linear map forward through a ``custom_vjp`` ("can't apply
    forward-mode autodiff (jvp) to a custom_vjp function"): use
    ``jax.jvp`` for forward-mode products, ``jax.vjp`` for reverse ones.

    Under reverse mode, the forward pass stores only the schedule's
    checkpoints, in a device buffer of ``(slots + 1, *leaf.shape)`` per carry
    leaf (the schedule's level-0 slots and the state in hand), and the
    backward pass executes the schedule's action table in compiled loops;
    ``f`` is traced once, whatever the length and slots.

    **Arguments:**

    - `f`: the step, ``f(carry, x) -> (carry, y)``; the carry must keep its
      structure, shapes and dtypes.  Arrays it closes over receive gradients
      (through ``jax.closure_convert``); no ``params`` argument is needed.
    - `init`: the initial carry ``u_0`` (a pytree of arrays).
    - `xs`: per-step inputs (a pytree of arrays with a leading axis of the
      number of steps), or ``None``.
    - `length`: the number of steps ``n``; required when `xs` is ``None``.
    - `schedule`: a :class:`~vlcc_adjoint.schedules.Schedule` for ``n``
      steps (``Revolve``, ``StoreAll``, ``Periodic``, ``Online(n, snapshots=c)``,
      single-level ``Multistage``, or any valid table on level 0).
    - `snapshots`: instead of `schedule`: ``Revolve(n, snapshots)``.  With
      neither, ``vlcc_adjoint.schedules.default_snapshots(n, repetitions=2)``
      (each step recomputed at most twice; ``c ~ sqrt(2 n)``).
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` for schedules
      with levels >= 1 (e.g. ``Multistage`` with a host level), holding
      every level of the schedule and its plan::

          TieredStore([DeviceTier(), MemoryTier(), ZarrTier(path)], plan=io_plan(schedule))

      ``store.tiers[k]`` holds level ``k``: tier 0, a
      :class:`~vlcc_adjoint.storage.DeviceTier`, stands for the device
      buffer's slots (the checkpoints stay on the device; the store
      follows their actions), the others are host levels.  The store reads
      restores ahead by the plan while the device computes.  Reached by
      ordered ``io_callback`` at captures and restores of host levels only;
      not under ``jax.vmap`` (a clear error) nor inside ``jax.checkpoint``
      (JAX refuses IO effects there: ``NotImplementedError: Effects not
      supported in partial-eval of checkpoint``; leave the scan outside
      the remat).  One store serves one loop at a time (each
      run restarts its plan).  A store of host tiers alone, without a plan
      (``store.tiers[k - 1]`` holding level ``k``, the earlier form), still
      works, with a ``DeprecationWarning`` and no read-ahead.  A
      device-only schedule ignores `store`.
    - `unroll`: forward steps per loop iteration, as in ``lax.scan``.
    - `reverse`: scan from the end, as ``lax.scan(..., reverse=True)``:
      step ``k`` reads ``xs[n - 1 - k]`` and writes ``ys[n - 1 - k]``.
    - `segment`: steps per segment (see :mod:`vlcc_adjoint.jax._segments`).
      ``1`` (default): the schedule runs over steps.  ``B > 1``: it runs
      over the ``length // B`` segments of ``B`` steps (a given `schedule`
      is for that many), each reversed by the VJP of a ``lax.scan`` that
      keeps its ``B`` steps' residuals; the remaining steps form one more
      segment.  ``"auto"``: ``B`` and the slots that minimise the forward
      count within the memory ``segment=1`` would use with `snapshots`
      slots (the slots plus one step's residuals, measured).

    **Returns:** ``(final_carry, ys)``.

    **Raises:** :class:`~vlcc_adjoint.errors.VlccError` (``ValueError`` /
    ``TypeError`` subclasses) at trace time for a carry that changes type,
    an `xs` / `length` mismatch, a schedule for another length, a traced
    (non-static) schedule, `snapshots`, `length` or `unroll`, options that
    do not combine (`schedule` with `snapshots`; ``segment="auto"`` with a
    `schedule`; host levels under ``jax.vmap``), a store that does not
    hold the schedule's levels or plan.

    **References:** A. Griewank and A. Walther, Algorithm 799: revolve,
    ACM TOMS 26(1), 2000.
    """
    if not callable(f):
        raise VlccTypeError(f"checkpointed_scan: `f` must be callable, got {f!r}")
    unroll = check_unroll(unroll)
    check_schedule(schedule, snapshots)
    xs_leaves, xs_tree = tree_flatten(xs)
    n = scan_length(xs_leaves, length)
    if n == 0 or _forward_mode([*tree_flatten(init)[0], *xs_leaves]):
        # Nothing to checkpoint (no steps, or forward mode, which stores
        # nothing per step); a schedule must still fit.
        if n == 0 and schedule is not None:
            resolve_program(n, schedule, snapshots)
        return lax.scan(f, init, xs, length=n, reverse=bool(reverse), unroll=unroll)
    if reverse:
        # lax.scan's reverse=True is the forward scan of the reversed inputs,
        # with the outputs reversed back.
        carry, ys = checkpointed_scan(
            f,
            init,
            jax.tree.map(lambda x: jnp.flip(jnp.asarray(x), 0), xs),
            n,
            schedule=schedule,
            snapshots=snapshots,
            store=store,
            unroll=unroll,
            segment=segment,
        )
        return carry, jax.tree.map(lambda y: jnp.flip(y, 0), ys)
    blocks = (
        1
        if isinstance(segment, (int, np.integer)) and not isinstance(segment, bool) and segment == 1
        else check_segment(segment, n, schedule)
    )
    if unroll == 0:  # unroll=True or 0: fully, as lax.scan
        unroll = n
    xs_leaves = [jnp.asarray(x) for x in xs_leaves]

    init_leaves, init_tree = tree_flatten(init)
    init_leaves = [_strip_weak(x) for x in init_leaves]
    init = tree_unflatten(init_tree, init_leaves)
    x0 = tree_unflatten(xs_tree, [x[0] for x in xs_leaves])

    # Trace f once.  `consts` are its closed-over, possibly differentiated arrays.
    f_conv, consts = jax.closure_convert(f, init, x0)
    if _forward_mode([*init_leaves, *xs_leaves, *consts]):
        # Forward mode through the closure alone (``jax.jvp`` of a parameter
        # that `f` closes over): as above, a plain scan.
        return lax.scan(f, init, xs, length=n, unroll=unroll)
    out_shape = jax.eval_shape(f_conv, init, x0, *consts)
    if not (isinstance(out_shape, (tuple, list)) and len(out_shape) == 2):
        raise VlccTypeError(
            "checkpointed_scan: f must return a pair (new_carry, y), as for "
            f"jax.lax.scan; got {jax.tree_util.tree_structure(out_shape)}"
        )
    _check_carry(init, out_shape[0])
    y_avals, y_tree = tree_flatten(out_shape[1])

    def step(c_leaves, x_leaves, k_leaves):
        c, y = f_conv(
            tree_unflatten(init_tree, c_leaves), tree_unflatten(xs_tree, x_leaves), *k_leaves
        )
        return tree_flatten(c)[0], tree_flatten(y)[0]

    if blocks == "auto":
        snapshots = slot_count(n, snapshots)
        state_bytes = tree_nbytes(init_leaves)
        blocks, snapshots = choose_segment(
            n, snapshots, state_bytes, residual_bytes(step, init_leaves, xs_leaves, consts)
        )
    assert isinstance(blocks, int)
    if blocks > 1:
        return segmented_scan(
            checkpointed_scan,
            f,
            init,
            xs,
            n,
            blocks,
            schedule=schedule,
            snapshots=snapshots,
            store=store,
            unroll=unroll,
        )
    program = resolve_program(n, schedule, snapshots, host=store is not None)

    host = None
    if program.levels > 1:
        if any(_batched(x) for x in [*init_leaves, *xs_leaves, *consts]):
            raise VlccValueError(
                "checkpointed_scan: a schedule with host levels (store=...) cannot run under "
                "jax.vmap: its io_callbacks sit under lax.cond, which JAX refuses to batch "
                "(IO effects in vmap-of-cond). Use a level-0 schedule under vmap, or loop "
                "over the batch"
            )
        host = HostSession(program, store, [jax.typeof(x) for x in init_leaves])
    # (A device-only schedule ignores `store`: its checkpoints never leave the device.)

    run = _make_custom_vjp(program, step, n, unroll, y_avals, host)
    # Arrays, not Python scalars (a differentiated closed-over float): the
    # rules read their shapes and dtypes.
    carry_leaves, ys_leaves = run(init_leaves, xs_leaves, [jnp.asarray(k) for k in consts])
    return tree_unflatten(init_tree, carry_leaves), tree_unflatten(y_tree, ys_leaves)


def _make_custom_vjp(program: Program, step: Callable, n: int, unroll: int, y_avals, host):
    """The custom_vjp function of ``(init_leaves, xs_leaves, const_leaves)``."""

    def plain(init, xs, consts, remat=False):
        return scan_leaves(step, init, xs, consts, n, unroll, remat)

    @jax.custom_vjp
    def run(init, xs, consts):
        return plain(init, xs, consts)

    def fwd(init, xs, consts):
        c_pert = [p.perturbed for p in init]
        x_pert = [p.perturbed for p in xs]
        k_pert = [p.perturbed for p in consts]
        init = [p.value for p in init]
        xs = [p.value for p in xs]
        consts = [p.value for p in consts]
        if _differentiated([*init, *xs, *consts]):
            # This forward rule is itself being differentiated (second order):
            # a differentiable scan, and the backward rule differentiates it.
            static = _Static((c_pert, x_pert, k_pert, True))
            return plain(init, xs, consts), (init, xs, consts, static)
        interp = Interpreter(program, step, unroll, host=host)
        buf = [jnp.zeros((program.rows,) + c.shape, c.dtype) for c in init]
        ys = [jnp.zeros((n,) + a.shape, a.dtype) for a in y_avals]
        cur, buf, ys, _ = interp.forward(list(init), xs, consts, ys, buf)
        if program.split_kind == SPLIT_AT_REVERSE:
            final, y_last = step(cur, index_rows(xs, n - 1), consts)
            ys = update_rows(ys, y_last, n - 1)
        else:
            final = cur
        static = _Static((c_pert, x_pert, k_pert, False))
        # Residuals: the buffer (the state where the sweep ended is in a row
        # of it, see _program._reverse_from_buffer), xs and the closure.
        return (final, ys), (buf, xs, consts, static)

    def bwd(res, cts):
        buf, xs, consts, static = res
        c_pert, x_pert, k_pert, second_order = static.value
        carry_ct, ys_ct = cts
        if second_order:
            cur = buf  # the residuals are init, xs, consts
        else:
            cur = [jnp.zeros(b.shape[1:], b.dtype) for b in buf]
            if _differentiated(jax.tree.leaves(cts)):
                raise NotImplementedError(
                    "checkpointed_scan: the pullback of a checkpointed_scan is being "
                    "differentiated with respect to its cotangents, through the schedule's "
                    "while loops, which JAX cannot differentiate in reverse mode. Differentiate "
                    "the whole function twice (jax.grad(jax.grad(...)), jax.hessian), which "
                    "checkpointed_scan supports, or use jax.lax.scan of a jax.checkpoint-ed step"
                )
        c_diff = [_inexact(c) for c in cur]
        x_diff = [p and _inexact(x) for p, x in zip(x_pert, xs)]
        k_diff = [p and _inexact(k) for p, k in zip(k_pert, consts)]
        y_live = [_inexact(a) and not isinstance(ct, SymbolicZero) for a, ct in zip(y_avals, ys_ct)]
        lam = [
            jnp.zeros(c.shape, c.dtype) if isinstance(ct, SymbolicZero) else ct
            for c, ct, d in zip(cur, carry_ct, c_diff)
            if d
        ]
        ys_bar = [ct for ct, live in zip(ys_ct, y_live) if live]
        if second_order:

            def primal(cd, xd, kd):
                carry, ys = plain(
                    _merge(cd, cur, c_diff),
                    _merge(xd, xs, x_diff),
                    _merge(kd, consts, k_diff),
                    remat=True,
                )
                return (
                    [v for v, d in zip(carry, c_diff) if d],
                    [v for v, live in zip(ys, y_live) if live],
                )

            _, pullback = jax.vjp(
                primal,
                [v for v, d in zip(cur, c_diff) if d],
                [v for v, d in zip(xs, x_diff) if d],
                [v for v, d in zip(consts, k_diff) if d],
            )
            lam, xs_bar, k_bar = pullback((lam, ys_bar))
            return _cotangents(lam, xs_bar, k_bar, c_diff, c_pert, x_diff, k_diff)
        interp = Interpreter(program, step, unroll, host=host)
        xs_bar = [jnp.zeros(x.shape, x.dtype) for x, d in zip(xs, x_diff) if d]
        k_bar = [jnp.zeros(k.shape, k.dtype) for k, d in zip(consts, k_diff) if d]

        def adjoint(i, cur, consts_, state):
            lam, xs_bar, k_bar = state
            x_i = index_rows(xs, i)

            def g(cd, xd, kd):
                c = _merge(cd, cur, c_diff)
                x = _merge(xd, x_i, x_diff)
                k = _merge(kd, consts_, k_diff)
                c_new, y = step(c, x, k)
                return (
                    [v for v, d in zip(c_new, c_diff) if d],
                    [v for v, live in zip(y, y_live) if live],
                )

            _, pullback = jax.vjp(
                g,
                [v for v, d in zip(cur, c_diff) if d],
                [v for v, d in zip(x_i, x_diff) if d],
                [v for v, d in zip(consts_, k_diff) if d],
            )
            dc, dx, dk = pullback((lam, index_rows(ys_bar, i)))
            xs_bar = update_rows(xs_bar, dx, i)
            k_bar = [a + b for a, b in zip(k_bar, dk)]
            return dc, xs_bar, k_bar

        (lam, xs_bar, k_bar), _ = interp.backward(
            list(cur), buf, xs, consts, adjoint, (lam, xs_bar, k_bar)
        )
        return _cotangents(lam, xs_bar, k_bar, c_diff, c_pert, x_diff, k_diff)

    run.defvjp(fwd, bwd, symbolic_zeros=True)
    return run


def _cotangents(lam, xs_bar, k_bar, c_diff, c_pert, x_diff, k_diff):
    """The backward rule's output: the cotangents of the differentiable
    inputs in place, ``None`` for the others."""
    lam_it, xs_it, k_it = iter(lam), iter(xs_bar), iter(k_bar)
    init_ct = [next(lam_it) if d else None for d in c_diff]
    init_ct = [v if p else None for v, p in zip(init_ct, c_pert)]
    xs_ct = [next(xs_it) if d else None for d in x_diff]
    k_ct = [next(k_it) if d else None for d in k_diff]
    return init_ct, xs_ct, k_ct


def _merge(diff_values, all_values, mask):
    """``all_values`` with the entries where `mask` is set taken from `diff_values`."""
    it = iter(diff_values)
    return [next(it) if m else v for v, m in zip(all_values, mask)]
