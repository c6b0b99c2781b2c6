"""Versions of an MPI heat solver: restart on another rank count, suspend, branch, diff.

A 2-D heat equation ``u_t = kappa * laplacian(u)`` (explicit Euler, zero
Dirichlet boundary) runs domain-decomposed in slabs over the ranks of
``MPI.COMM_WORLD``, with a halo exchange
(:class:`~vlcc_adjoint.mpi.HaloExchange`) each step.  Every ``--every``
steps the ranks commit the state (each rank its block of ``u``, and the
step, time and ``kappa`` every rank holds alike) as one version of a
:class:`~vlcc_adjoint.lineage.History` opened with ``comm=``.

* **Checkpoint-restart on another rank count.**  Run again with the same
  path: the run resumes from the newest version of its branch, on however
  many ranks it now has (each rank reads only the rows of the stored blocks
  that overlap its new block)::

      mpiexec -n 4 python examples/mpi_heat_lineage.py /tmp/heat.vlcc --steps 40
      mpiexec -n 3 python examples/mpi_heat_lineage.py /tmp/heat.vlcc --steps 60

* **Suspend on a signal.**  ``SIGUSR1`` or ``SIGTERM`` to any rank (a batch
  system's warning before the wall-clock limit): at the next step every rank
  learns it (one ``allreduce`` of a flag), they commit together and exit
  with status 0; the next run resumes there.
* **Branch with another parameter and compare.**  ``--branch alt --at REF
  --kappa 0.05`` starts branch ``alt`` at version ``REF`` with another
  diffusivity; ``--diff main alt`` (serial, no MPI) prints how the fields of
  the two branches' tips differ (block by block when both were committed on
  the same ranks, as whole fields otherwise)::

      mpiexec -n 3 python examples/mpi_heat_lineage.py /tmp/heat.vlcc --branch alt \\
          --at main~2 --kappa 0.05 --steps 60
      python examples/mpi_heat_lineage.py /tmp/heat.vlcc --diff main alt

The stencil adds its terms in one fixed order on every rank, and the halo
holds the neighbours' values exactly, so the field does not depend on the
number of ranks: a run restarted on 3 ranks ends bit for bit where one
uninterrupted serial run (:func:`reference`) ends.
``tests/examples/test_mpi_heat_lineage.py`` checks that.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from vlcc_adjoint.cli import Integer, Number, Parser
from vlcc_adjoint.lineage import History
from vlcc_adjoint.mpi import Decomposition, DistributedArray, HaloExchange


def initial(n: int) -> np.ndarray:
    """The initial temperature on the global n x n grid: a hot square off centre."""
    u = np.zeros((n, n))
    u[n // 4 : n // 2, n // 3 : (2 * n) // 3] = 1.0
    return u


def update(padded: np.ndarray, kappa: float, dt: float) -> np.ndarray:
    """One Euler step of the interior of a block padded by one layer (5-point Laplacian)."""
    c = padded[1:-1, 1:-1]
    lap = padded[2:, 1:-1] + padded[:-2, 1:-1] + padded[1:-1, 2:] + padded[1:-1, :-2] - 4.0 * c
    return c + (dt * kappa) * lap


def reference(n: int, steps: int, kappa: float = 0.2, dt: float = 0.2) -> np.ndarray:
    """The field after `steps` steps, serially (the referee of the tests)."""
    u = initial(n)
    for _ in range(steps):
        u = update(np.pad(u, 1), kappa, dt)
    return u


_STOP = {"asked": False}


def _ask_to_stop(signum, frame) -> None:
    _STOP["asked"] = True


def run(
    path: str,
    steps: int,
    every: int = 10,
    n: int = 32,
    kappa: float = 0.2,
    dt: float = 0.2,
    branch: str = "main",
    at: str | None = None,
    delay: float = 0.0,
    local: str | None = None,
) -> int:
    """Advance `branch` of the History at `path` to `steps`, on the ranks of
    ``MPI.COMM_WORLD``; resume from the branch's newest version if it has one.
    With `local` (a node-local directory such as ``/dev/shm``), commits are
    staged there and flushed to `path` in the background, one pack per node.

    **Returns:** the step reached (smaller than `steps` when suspended).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    d = Decomposition.split((n, n), (size, 1))
    halo = HaloExchange(comm, d, width=1)
    signal.signal(signal.SIGUSR1, _ask_to_stop)
    signal.signal(signal.SIGTERM, _ask_to_stop)
    if rank == 0:
        print(f"rank 0 pid {os.getpid()}", flush=True)
    with History(path, comm=comm, local=local) as h:
        # Every rank takes the same path: rank 0's view of the refs decides
        # (a rank reading them later could see the branch rank 0 just made).
        exists = comm.bcast(branch in h.branches, root=0)
        if exists:
            state = h.checkout(branch, decomposition=d)
            say = f"resumed {branch} from step {state['step']} on {size} ranks"
        elif at is not None:
            h.branch(branch, at=at)
            state = h.checkout(branch, decomposition=d)
            state["kappa"] = kappa
            say = f"branched {branch} at step {state['step']} with kappa {kappa}"
        else:
            u = DistributedArray(np.ascontiguousarray(initial(n)[d.slices(rank)]), d, rank)
            state = {"u": u, "step": 0, "t": 0.0, "kappa": kappa}
            h.commit(state, message="initial state", meta={"step": 0}, branch=branch)
            say = f"started {branch} on {size} ranks"
        if rank == 0:
            print(say, flush=True)
        padded = halo.empty()
        while state["step"] < steps:
            halo.interior(padded)[...] = state["u"].local
            halo.exchange(padded)
            state["u"].local = update(padded, state["kappa"], dt)
            state["step"] += 1
            state["t"] += dt
            stop = comm.allreduce(_STOP["asked"], op=MPI.LOR)
            if stop or state["step"] % every == 0 or state["step"] == steps:
                word = "suspended at" if stop else "step"
                h.commit(state, message=f"{word} {state['step']}", meta={"step": state["step"]})
            if stop:
                if rank == 0:
                    print(f"suspended at step {state['step']}", flush=True)
                break
            if delay:
                time.sleep(delay)
    halo.free()
    return state["step"]


def diff(path: str, a: str, b: str) -> None:
    """Print how the fields of versions `a` and `b` differ (serial: no MPI)."""
    with History(path, mode="r") as h:
        d = h.diff(a, b)
        for leaf in d.leaves:
            if leaf.status == "changed":
                print(f"{leaf.path}: changed, max |a - b| = {leaf.max_abs:.3g}")
            elif leaf.status != "same":
                print(f"{leaf.path}: {leaf.status}")
        for where, x, y in d.values:
            print(f"{where}: {x} -> {y}")


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the History directory (created, or resumed)")
    parser.add_argument("--steps", type=Integer(1), default=40, help="step to reach")
    parser.add_argument("--every", type=Integer(1), default=10, help="commit every k steps")
    parser.add_argument("--n", type=Integer(4), default=32, help="global grid is n x n")
    parser.add_argument("--kappa", type=Number(0.0), default=0.2, help="diffusivity")
    parser.add_argument("--branch", default="main", help="the branch to advance")
    parser.add_argument("--at", default=None, help="where a new --branch starts (a ref)")
    parser.add_argument("--delay", type=Number(0.0), default=0.0, help="seconds per step")
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two refs, serially")
    parser.add_argument("--local", default=None, help="stage commits in this node-local directory")
    return parser


if __name__ == "__main__":
    args = build_parser().parse_args()
    if args.diff:
        diff(args.path, *args.diff)
    else:
        run(
            args.path,
            args.steps,
            every=args.every,
            n=args.n,
            kappa=args.kappa,
            branch=args.branch,
            at=args.at,
            delay=args.delay,
            local=args.local,
        )
