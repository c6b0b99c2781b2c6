"""Observe the JAX interpreter running a schedule, as a comparable :class:`Trace`.

DESIGN.md asks for one test that runs the same tables through all three
interpreters (``simulate``, the Python executor, the JAX backward pass) and
compares what they did.  :func:`jax_trace` is the JAX third: it runs the
compiled loops of :mod:`._interpret` on a solver whose state is its own step
counter (``u_i = i``, an ``int32``), logging every forward step and, at every
adjoint step, the state actually in hand.  A wrong slot map, a stale Load or
a skipped Advance shows up as a wrong ``reverse_states`` entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from ..schedules import Schedule, Trace
from ._host import HostSession
from ._interpret import Interpreter
from ._program import compile_program

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["jax_trace"]


def jax_trace(schedule: Schedule, store: TieredStore | None = None) -> Trace:
    """Run `schedule` through the JAX interpreter and return what it did.

    **Arguments:** `schedule`; `store`, a ``TieredStore`` for a schedule
    with levels >= 1, as for :func:`checkpointed_scan`:
    ``TieredStore([DeviceTier(), ...], plan=io_plan(schedule))``.

    **Returns:** a :class:`Trace` with `forward_steps` (every forward step the
    compiled advances ran, in order), `reverse_steps`, `reads` / `writes` of
    level 0, and `reverse_states` (the counter state in hand at each adjoint
    step).  Compare with :func:`table_trace` via :meth:`Trace.assert_equal`.
    """
    program = compile_program(schedule, host=store is not None)
    n = program.n_steps
    host = None
    if program.levels > 1:
        # With the store's read-ahead on (a planned store): a restore
        # collected from a read started early must still hand over the
        # right state.
        host = HostSession(program, store, [jax.ShapeDtypeStruct((), jnp.int32)])
    i32 = jnp.int32

    def step(c, x, k):
        return [c[0] + 1], []

    def adjoint(i, cur, consts, state):
        seen, ptr = state
        return seen.at[ptr].set(cur[0]), ptr + 1

    @jax.jit
    def run():
        interp = Interpreter(program, step, record=True, host=host)
        buf = [jnp.zeros((program.rows,), i32)]
        cur, buf, _, logs = interp.forward([jnp.asarray(0, i32)], [], [], None, buf)
        (seen, _), logs = interp.backward(
            cur, buf, [], [], adjoint, (jnp.full(n, -1, i32), jnp.asarray(0, i32)), logs
        )
        return seen, logs

    seen, (fwd_log, rev_log, counts) = jax.device_get(run())
    fwd_steps = np.asarray(fwd_log[0][: int(fwd_log[1])], np.int64)
    rev_steps = np.asarray(rev_log[0][: int(rev_log[1])], np.int64)
    reads, writes = [int(counts[0])], [int(counts[1])]
    if host is not None:
        # Moves between the device and the host count on both sides.
        reads = [reads[0] + int(host.reads[0])] + [int(r) for r in host.reads[1:]]
        writes = [writes[0] + int(host.writes[0])] + [int(w) for w in host.writes[1:]]
    pad = [0] * (len(schedule.levels) - len(reads))
    return Trace(
        fwd_steps,
        rev_steps,
        tuple(reads + pad),
        tuple(writes + pad),
        reverse_states=np.asarray(seen, np.int64),
    )
