"""Real adjoint problems for the examples, the tests, the benchmarks and ``vlcc demo``.

Each problem implements the solver protocol of :mod:`vlcc_adjoint.solver`
(``forward(state, step) -> state``, ``adjoint(state, adj, step) -> adj``,
``copy(state)``, ``forward_many(state, start, stop)``) with hand-written
*discrete* adjoints in numba (serial, ``nogil``: a storage engine's threads
run while a step computes), and a store-everything ``reference_gradient``
that referees every checkpointed run.

- :class:`~vlcc_adjoint._examples.seismic.SeismicProblem`: 2-D acoustic
  full-waveform inversion (gradient of a data misfit w.r.t. the velocity).
- :class:`~vlcc_adjoint._examples.burgers.BurgersProblem`: 1-D viscous
  Burgers (gradient of a final-time misfit w.r.t. the initial condition).
- :class:`~vlcc_adjoint._examples.mpi_seismic.DistributedSeismic`: the
  seismic problem on slabs of rows, one per MPI rank, built on
  :mod:`vlcc_adjoint.mpi` alone (import it from its module: it loads the
  MPI integration, which the serial problems do not need).

The problems' modules import numba (and the MPI one :mod:`vlcc_adjoint.mpi`);
nothing compiles until the first step runs (and compiled kernels are cached
on disk).
"""

from .burgers import BurgersProblem as BurgersProblem
from .seismic import SeismicProblem as SeismicProblem
from .seismic import WaveState as WaveState

__all__ = ["BurgersProblem", "SeismicProblem", "WaveState"]
