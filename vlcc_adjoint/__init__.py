"""vlcc-adjoint: checkpointing for adjoint and other revisit-the-past computations.

The public names live in their subpackages (``vlcc_adjoint.schedules``,
``vlcc_adjoint.storage``, ...); the most used ones are re-exported here.
Heavy optional dependencies (jax, mpi4py, torch) are imported only by the
modules that need them.
"""

from . import state as _state
from .budget import BudgetPlan as BudgetPlan
from .budget import plan as plan
from .errors import VlccError as VlccError
from .execute import AdjointResult as AdjointResult
from .execute import ErrorBudgetReport as ErrorBudgetReport
from .execute import NonFiniteError as NonFiniteError
from .execute import StateMismatchError as StateMismatchError
from .execute import run_adjoint as run_adjoint
from .schedules import Advance as Advance
from .schedules import Delete as Delete
from .schedules import InvalidScheduleError as InvalidScheduleError
from .schedules import Level as Level
from .schedules import Load as Load
from .schedules import Move as Move
from .schedules import Multistage as Multistage
from .schedules import Online as Online
from .schedules import Periodic as Periodic
from .schedules import Reverse as Reverse
from .schedules import Revolve as Revolve
from .schedules import Save as Save
from .schedules import Schedule as Schedule
from .schedules import ScheduleStats as ScheduleStats
from .schedules import StoreAll as StoreAll
from .schedules import io_plan as io_plan
from .schedules import simulate as simulate
from .solver import Solver as Solver
from .solver import timestep as timestep

# JAX arrays and pytrees in states without importing vlcc_adjoint.jax first:
# the provider (vlcc_adjoint/jax/_state.py) registers itself the first time a
# state is flattened or unflattened after JAX is imported, or a checkpoint
# holds a JAX leaf.  Nothing is imported until then.
_state.register_lazy_provider(
    "jax", tags=("jax",), load="vlcc_adjoint.jax._state:register_provider"
)
# torch tensors likewise (vlcc_adjoint/torch/_state.py).
_state.register_lazy_provider(
    "torch", tags=("torch",), load="vlcc_adjoint.torch._state:register_providers"
)


def _run_spmd(*args, **kwargs):
    """``run_adjoint(..., comm=)``: load the MPI integration on first use and run there."""
    from .mpi import run_adjoint as run_on_every_rank

    return run_on_every_rank(*args, **kwargs)


# run_adjoint(..., comm=comm) works without importing vlcc_adjoint.mpi first;
# mpi4py is imported only by such a call (the MPI module registers its own
# runner, the same function, when it is imported).
from .execute import register_spmd as _register_spmd  # noqa: E402

_register_spmd(_run_spmd)

__version__ = "0.1.0"
