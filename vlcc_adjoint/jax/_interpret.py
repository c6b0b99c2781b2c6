"""The JAX interpreter of a compiled schedule: compiled loops over static data.

A :class:`~vlcc_adjoint.jax._program.Program` is a static ``int32`` array of
instructions (columns ``C_LOAD, C_A, C_B, C_SAVE, C_HKIND, C_HID,
C_HSLOT``) plus the ``bounds`` that say which instructions prepare which
adjoint step, and ``rev_row``, the buffer row each adjoint step reads.  An
instruction does

    HOST kind      io_callback to the TieredStore       lax.cond on kind >= 0
    LOAD slot      cur = buf[slot]                      lax.cond on slot >= 0
    ADVANCE a..b   for i in a..b-1: cur, y_i = f(cur, xs[i])
                                                        inner while_loop
    SAVE slot      buf[slot] = cur                      lax.cond, in place

The forward sweep is one ``while_loop`` over its instructions.  The backward
pass is a ``fori_loop`` of exactly ``n`` iterations; iteration ``k`` runs
instructions ``bounds[k] .. bounds[k+1]`` (a while loop) and then the adjoint
step ``i = n - 1 - k``, unconditionally: the VJP of ``f`` at ``(buf[rev_row[k]],
xs[i])``, reading the state straight from its buffer row.

Each of ``f`` and its VJP appears once in the loop bodies (``unroll`` copies
of ``f`` when unrolling), so the compiled program's size and compile time do
not depend on ``n`` or the number of slots: those only change the length of
the static arrays.  The conds keep the device buffer ``buf`` (one array of
shape ``(rows, *leaf.shape)`` per carry leaf) in place: XLA updates a buffer
inside a conditional inside a while loop without copying it (a ``jnp.where``
would read and write a whole slot every instruction).  Fields that a part
never uses (no LOAD in a Revolve sweep, no HOST without a store) are pruned
at trace time.

Why the adjoint step is not under a ``lax.cond`` and does not read ``cur``:
measured on the 256^2 wave (``benchmarks/bench_jax.py``), a cond around the
VJP made XLA copy the cotangents through the untaken branch and back into
the loop carry on every instruction, and a Load into ``cur`` right before
the adjoint step costs a state copy that the VJP's own read of the row
avoids.  On CPU, checkpoint traffic (a 0.5 MiB state read from a buffer
larger than the cache) costs about as much as a forward step, so copies
matter as much as recomputations.

Everything here works on flat lists of leaves; ``_scan.py`` does the pytree
and custom_vjp plumbing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import VlccValueError
from ._program import C_A, C_B, C_HID, C_HKIND, C_HSLOT, C_LOAD, C_SAVE, Program

__all__ = ["Interpreter", "Step", "index_rows", "scan_leaves", "update_rows"]

Leaves = list  # a flat list of arrays

#: One forward step on flat leaves: ``step(carry_leaves, x_leaves,
#: const_leaves) -> (carry_leaves, y_leaves)``; ``x_leaves`` is ``[]`` for a
#: scan without inputs.
Step = Callable[[Leaves, Leaves, Leaves], tuple[Leaves, Leaves]]

_I32 = np.int32


def index_rows(arrays: Sequence, i) -> Leaves:
    """Row `i` (a traced or static index) of each array in `arrays`: the
    per-step slice of stacked leaves (``xs[i]``, ``buf[slot]``)."""
    return [lax.dynamic_index_in_dim(x, i, 0, keepdims=False) for x in arrays]


def update_rows(arrays: Sequence, values: Sequence, i) -> Leaves:
    """`arrays` with row `i` of each replaced by the matching entry of
    `values` (in place inside a loop: XLA reuses the buffer)."""
    return [lax.dynamic_update_index_in_dim(x, v, i, 0) for x, v in zip(arrays, values)]


def scan_leaves(
    step: Step,
    init: Leaves,
    xs: Leaves,
    consts: Leaves,
    length: int,
    unroll: int = 1,
    remat: bool = False,
) -> tuple[Leaves, Leaves]:
    """``lax.scan`` of `step` over flat leaves: the one plain scan of a step.

    **Arguments:** `step` (:data:`Step`); the carry's leaves `init`; the
    per-step inputs `xs` (leaves with a leading axis of `length`; ``[]``
    for none: the step then receives ``[]``, never ``None``); the closure's
    leaves `consts`; `unroll` as ``lax.scan``'s; `remat`: scan the
    ``jax.checkpoint`` of the step (its reverse mode then stores one carry
    per step and recomputes the step's intermediates).

    **Returns:** ``(final_carry_leaves, ys_leaves)``.
    """

    def body(c, x):
        return step(c, [] if x is None else x, consts)

    return lax.scan(
        jax.checkpoint(body) if remat else body,
        init,
        xs if xs else None,
        length=length,
        unroll=unroll,
    )


class Interpreter:
    """Runs the two parts of a :class:`Program` for one step function.

    **Arguments:**

    - `program`: the compiled schedule.
    - `step`: one forward step on flat leaves (:data:`Step`).
    - `unroll`: forward steps per iteration of the advance loops (>= 1).
    - `record`: also log every forward step and adjoint step (for
      :func:`vlcc_adjoint.jax.jax_trace`; costs two int buffers).
    - `host`: a :class:`~vlcc_adjoint.jax._host.HostSession` for programs
      with host instructions (levels >= 1), else ``None``.
    """

    def __init__(
        self, program: Program, step: Step, unroll: int = 1, record: bool = False, host=None
    ):
        self.program = program
        self.step = step
        self.unroll = max(1, int(unroll))
        self.record = record
        self.host = host
        if host is None and program.uses(program.code, C_HKIND):
            raise VlccValueError("this program has host instructions: pass a HostSession")

    # -- pieces -------------------------------------------------------------

    def _advance(self, a, b, cur, xs, consts, ys, log):
        """``cur = u_b`` from ``cur = u_a``; writes ``ys[i]`` if `ys` is given."""

        def one(i, cur, ys, log):
            cur, y = self.step(cur, index_rows(xs, i), consts)
            if ys is not None:
                ys = update_rows(ys, y, i)
            if log is not None:
                buf, ptr = log
                log = (buf.at[ptr].set(i), ptr + 1)
            return cur, ys, log

        def run(state, per_iter):
            def cond(s):
                return s[0] + per_iter <= b

            def body(s):
                i, cur, ys, log = s
                for j in range(per_iter):
                    cur, ys, log = one(i + j, cur, ys, log)
                return i + per_iter, cur, ys, log

            return lax.while_loop(cond, body, state)

        state = (a, cur, ys, log)
        if self.unroll > 1:
            # Bulk in chunks of `unroll` steps, then the remainder one by one.
            state = run(state, self.unroll)
        _, cur, ys, log = run(state, 1)
        return cur, ys, log

    def _log_init(self):
        if not self.record:
            return None, None
        p = self.program
        fwd = (jnp.zeros(max(p.forward_count, 1), _I32), jnp.asarray(0, _I32))
        rev = (jnp.zeros(p.n_steps, _I32), jnp.asarray(0, _I32))
        return fwd, rev

    def _instructions(self, code_np, code, lo, hi, cur, buf, xs, consts, ys, fwd_log, counts):
        """Run instructions ``[lo, hi)`` of `code` (a while loop)."""
        p = self.program
        has_load = p.uses(code_np, C_LOAD)
        has_save = p.uses(code_np, C_SAVE)
        has_adv = p.uses(code_np, C_A)
        has_host = p.uses(code_np, C_HKIND)

        def body(state):
            j, cur, buf, ys, fwd_log, counts = state
            ins = code[j]
            if has_host:
                hk = ins[C_HKIND]
                cur, buf = lax.cond(
                    hk >= 0,
                    lambda c, b: self.host.instruction(
                        jnp.maximum(hk, 0), ins[C_HID], jnp.maximum(ins[C_HSLOT], 0), c, b
                    ),
                    lambda c, b: (list(c), list(b)),
                    list(cur),
                    list(buf),
                )
            if has_load:
                cur, counts = self._load(ins[C_LOAD], cur, buf, counts)
            if has_adv:
                cur, ys, fwd_log = self._advance(ins[C_A], ins[C_B], cur, xs, consts, ys, fwd_log)
            if has_save:
                buf, counts = self._save(ins[C_SAVE], cur, buf, counts)
            return j + 1, cur, buf, ys, fwd_log, counts

        state = (lo, cur, buf, ys, fwd_log, counts)
        _, cur, buf, ys, fwd_log, counts = lax.while_loop(lambda s: s[0] < hi, body, state)
        return cur, buf, ys, fwd_log, counts

    def forward(self, cur: Leaves, xs: Leaves, consts: Leaves, ys: Leaves | None, buf: Leaves):
        """Run the forward sweep (instructions ``[0, split)``) from ``cur = u_0``.

        Returns ``(cur, buf, ys, logs)``: the state in hand where the sweep
        ends (``u_{n-1}`` or ``u_n``, see ``Program.split_kind``), the
        filled device buffer, the outputs of every step the sweep ran, and
        the logs (``None`` entries unless recording).
        """
        p = self.program
        fwd_log, rev_log = self._log_init()
        counts = jnp.zeros(2, _I32) if self.record else None
        code_np = p.forward
        if len(code_np):
            cur, buf, ys, fwd_log, counts = self._instructions(
                code_np,
                jnp.asarray(code_np),
                jnp.asarray(0, _I32),
                len(code_np),
                cur,
                buf,
                xs,
                consts,
                ys,
                fwd_log,
                counts,
            )
        return cur, buf, ys, (fwd_log, rev_log, counts)

    def _load(self, slot, cur, buf, counts):
        cur = lax.cond(slot >= 0, lambda: index_rows(buf, jnp.maximum(slot, 0)), lambda: list(cur))
        if counts is not None:
            counts = counts.at[0].add((slot >= 0).astype(_I32))
        return cur, counts

    def _save(self, slot, cur, buf, counts):
        buf = lax.cond(
            slot >= 0,
            lambda b: update_rows(b, cur, jnp.maximum(slot, 0)),
            lambda b: list(b),
            list(buf),
        )
        if counts is not None:  # saves to the scratch row are no schedule Saves
            counts = counts.at[1].add(((slot >= 0) & (slot < self.program.slots)).astype(_I32))
        return buf, counts

    # -- the backward pass --------------------------------------------------

    def backward(
        self,
        cur: Leaves,
        buf: Leaves,
        xs: Leaves,
        consts: Leaves,
        adjoint: Callable,
        adj_state,
        logs=None,
    ):
        """Run the backward pass: ``n`` iterations of (instructions, adjoint step).

        `cur` only gives the shapes of the state in hand (its value is never
        read: the backward pass starts by loading).  `adjoint` is
        ``adjoint(i, u_i, consts, adj_state) -> adj_state``: the adjoint step
        ``i`` (the VJP of the step and the bookkeeping of cotangents, see
        ``_scan.py``), given ``u_i`` as read from its buffer row.  Returns
        the final `adj_state` and the logs.
        """
        p = self.program
        n = p.n_steps
        code_np = p.code
        code = jnp.asarray(code_np)
        bounds = jnp.asarray(p.bounds)
        rev_row = jnp.asarray(p.rev_row)
        rev_reads = jnp.asarray(p.rev_reads)
        any_instructions = len(p.backward) > 0
        if self.record:
            fwd_log, _, counts = logs
            _, rev_log = self._log_init()
        else:
            fwd_log = rev_log = counts = None

        def body(k, state):
            cur, buf, adj_state, fwd_log, rev_log, counts = state
            if any_instructions:
                cur, buf, _, fwd_log, counts = self._instructions(
                    p.backward,
                    code,
                    bounds[k],
                    bounds[k + 1],
                    cur,
                    buf,
                    xs,
                    consts,
                    None,
                    fwd_log,
                    counts,
                )
            i = n - 1 - k
            # u_i straight from its row: XLA fuses the slice into the VJP.
            adj_state = adjoint(i, index_rows(buf, rev_row[k]), consts, adj_state)
            if rev_log is not None:
                rbuf, rptr = rev_log
                rev_log = (rbuf.at[rptr].set(i), rptr + 1)
                counts = counts.at[0].add(rev_reads[k].astype(_I32))
            return cur, buf, adj_state, fwd_log, rev_log, counts

        state = (cur, buf, adj_state, fwd_log, rev_log, counts)
        cur, buf, adj_state, fwd_log, rev_log, counts = lax.fori_loop(0, n, body, state)
        if self.host is not None:
            self.host.end_of_pass(jnp.asarray(0, _I32))
        return adj_state, (fwd_log, rev_log, counts)
