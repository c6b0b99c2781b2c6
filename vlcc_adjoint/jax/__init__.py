"""JAX integration: ``jax.lax.scan`` with a schedule-driven reverse mode.

:func:`checkpointed_scan` has ``lax.scan``'s signature and semantics
(``length=0`` and ``reverse=True`` included); its ``custom_vjp`` executes a
checkpoint schedule's action table (Revolve by default, any
:class:`~vlcc_adjoint.schedules.Schedule`) in compiled loops, with the
checkpoints in a device buffer of the schedule's level-0 slots and, for
multi-level schedules, every level in a
:class:`~vlcc_adjoint.storage.TieredStore` that runs the whole schedule's
plan (tier 0 a :class:`~vlcc_adjoint.storage.DeviceTier` for the device
slots, the slower levels reached by ``io_callback``)::

    from vlcc_adjoint.jax import checkpointed_scan

    def loss(params, u0, xs):
        step = lambda u, x: (rhs(params, u, x), observe(u))   # closes over params
        u_n, ys = checkpointed_scan(step, u0, xs, snapshots=30)
        return misfit(u_n, ys)

    jax.grad(loss)(params, u0, xs)          # gradients to params, u0 and xs

Forward mode (``jax.jvp``) runs as ``lax.scan``; second-order reverse mode
(``jax.grad`` of ``jax.grad``, ``jax.hessian``) runs the reverse pass of a
``jax.checkpoint``-ed ``lax.scan``, one carry per step, not the schedule.

Also :func:`checkpointed` (a decorator for step functions) and
:func:`checkpointed_fori_loop`.  :func:`compile_program` shows what the
backward pass will execute; :func:`host_io_stats` reports what the host
levels did (restores read ahead, time the program stalled);
:func:`jax_trace` records what the JAX interpreter ran, to compare with
:func:`vlcc_adjoint.schedules.table_trace` (the schedule's semantics).

Importing this module imports JAX; ``import vlcc_adjoint`` does not.
"""

from ._host import HostIOStats as HostIOStats
from ._host import host_io_stats as host_io_stats
from ._loops import CheckpointedStep as CheckpointedStep
from ._loops import checkpointed as checkpointed
from ._loops import checkpointed_fori_loop as checkpointed_fori_loop
from ._program import Program as Program
from ._program import compile_program as compile_program
from ._scan import checkpointed_scan as checkpointed_scan
from ._state import register_provider as _register_provider
from ._trace import jax_trace as jax_trace

_register_provider()

from ..errors import deprecated_getattr as _deprecated_getattr  # noqa: E402


def _schedules_name(name):
    def load():
        from .. import schedules

        return getattr(schedules, name)

    return load


def _scan_default_snapshots(n: int) -> int:
    """The snapshots :func:`checkpointed_scan` uses for a scan of length `n`
    when given none: ``vlcc_adjoint.schedules.default_snapshots(n, repetitions=2)``."""
    from ..schedules import default_snapshots

    return default_snapshots(n, repetitions=2)


#: Schedule tracing helpers once re-exported here; they live in
#: vlcc_adjoint.schedules and still import from here with a DeprecationWarning.
__getattr__ = _deprecated_getattr(
    __name__,
    {
        **{
            name: (_schedules_name(name), f"vlcc_adjoint.schedules.{name}")
            for name in ("Trace", "table_trace")
        },
        "default_snapshots": (
            lambda: _scan_default_snapshots,
            "vlcc_adjoint.schedules.default_snapshots(n, repetitions=2), "
            "the policy checkpointed_scan applies",
        ),
    },
)

__all__ = [
    "CheckpointedStep",
    "HostIOStats",
    "Program",
    "checkpointed",
    "checkpointed_fori_loop",
    "checkpointed_scan",
    "compile_program",
    "host_io_stats",
    "jax_trace",
]
