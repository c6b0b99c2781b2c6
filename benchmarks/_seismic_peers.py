"""pyrevolve driving the seismic example: the peer of ``bench_seismic.py``.

pyrevolve (PyPI ``pyrevolve``, the checkpointing library Devito uses) checkpoints a
solver through two small interfaces:

* an ``Operator`` with ``apply(t_start, t_end)``: the forward operator
  advances the live state over the steps ``t_start .. t_end - 1``, the
  reverse operator runs the adjoint of one step;
* a ``Checkpoint`` with ``dtype``, ``size`` and ``get_data(t)`` /
  ``get_data_location(t)``: the numpy arrays that make up the live state,
  copied into (``save``) and out of (``load``) pyrevolve's ``NumpyStorage``,
  one preallocated ``(snapshots, size)`` array.

Here they wrap the numba kernels of
:class:`vlcc_adjoint._examples.seismic.SeismicProblem`, so pyrevolve and
vlcc-adjoint run the very same forward (``forward_many``) and adjoint
(``adjoint``) code; only the checkpointing differs.

Two drivers, both pyrevolve's C++ Revolve (``pyrevolve.Revolver``, i.e.
``MemoryRevolver``: ``CRevolve`` scheduler, ``NumpyStorage``):

* ``taped=True``: pyrevolve as shipped.  Its ``apply_reverse`` turns every
  ``youturn`` into ``fwd.apply(capo, capo + 1)`` followed by
  ``rev.apply(capo, capo + 1)``: Revolve's model, in which an adjoint step
  re-runs ("tapes") its forward step.  That is what Devito's gradient
  operator needs (it reads ``u`` at ``t - 1, t, t + 1``), and it costs one
  forward step more per adjoint step.  The reverse operator then finds
  ``u_capo`` in ``prev`` (the state is ``(u_capo, u_capo+1)``).
* ``taped=False``: the same scheduler, storage and operators, with
  ``apply_reverse`` overridden (20 lines, below) to skip that forward step,
  because this adjoint step needs only ``u_capo`` itself: the strongest
  pyrevolve a seismic user could write, and the same number of forward
  steps as vlcc's ``Revolve(n, c)``.

Forward counts: pyrevolve's advances (``advance`` plus the last forward run,
which reaches ``u_n``) number ``t(n, c) + 1``, Griewank's optimum plus the
step to ``u_n``; the taped driver adds ``n - 1`` (one per ``youturn``).
"""

from __future__ import annotations

import numpy as np
import pyrevolve
from pyrevolve.schedulers import Action

from vlcc_adjoint._examples.seismic import SeismicProblem, WaveState

__all__ = ["PyrevolveSeismic"]


class _Live:
    """The live state both operators and the checkpoint object see."""

    def __init__(self):
        self.state: WaveState | None = None  # u_k as (u_{k-1}, u_k)
        self.adj: WaveState | None = None


class _WaveCheckpoint(pyrevolve.Checkpoint):
    """pyrevolve's view of a :class:`WaveState`: its two arrays, read at call
    time (the forward kernel swaps their roles every step)."""

    def __init__(self, live: _Live, problem: SeismicProblem):
        self.live = live
        self._size = 2 * problem.nz * problem.nx

    @property
    def dtype(self):
        return np.float64

    @property
    def size(self):
        return self._size

    def get_data(self, timestep):
        s = self.live.state
        return [s.prev, s.curr]

    def get_data_location(self, timestep):
        s = self.live.state
        return [s.prev, s.curr]


class _Forward(pyrevolve.Operator):
    """``apply(a, b)``: ``u_a -> u_b`` in place, by ``forward_many``."""

    def __init__(self, live: _Live, problem: SeismicProblem):
        self.live, self.problem = live, problem
        self.steps = 0

    def apply(self, t_start, t_end):
        self.steps += t_end - t_start
        self.problem.forward_many(self.live.state, t_start, t_end)


class _Reverse(pyrevolve.Operator):
    """``apply(i, i + 1)``: adjoint step ``i`` (``lambda_{i+1} -> lambda_i``).

    `field` says where ``u_i`` is: ``"prev"`` when the live state is
    ``u_{i+1}`` (after pyrevolve's taped forward step, and at the first
    reverse step, which follows the forward run to ``u_n``), ``"curr"``
    when it is ``u_i``.  The first call starts the adjoint from
    ``lambda_n = problem.final_adjoint(u_n)``.
    """

    def __init__(self, live: _Live, problem: SeismicProblem):
        self.live, self.problem = live, problem
        self.field = "prev"
        self.calls = 0

    def apply(self, t_start, t_end):
        assert t_end == t_start + 1, "the reverse operator runs one step at a time"
        s = self.live.state
        if self.live.adj is None:
            self.live.adj = self.problem.final_adjoint(s)  # s is u_n here
        u_i = s.prev if self.field == "prev" else s.curr
        # The adjoint step reads only the current field of its state.
        self.live.adj = self.problem.adjoint(WaveState(s.curr, u_i), self.live.adj, t_start)
        self.calls += 1


class _UntapedRevolver(pyrevolve.Revolver):
    """``pyrevolve.Revolver`` whose reverse sweep does not re-run the forward
    step before each adjoint step (see the module docstring)."""

    def apply_reverse(self):
        # pyrevolve's loop, timers included, less the forward step of REVERSE.
        sched, rev, timer = self.scheduler, self.rev_operator, self.profiler.get_timer
        while True:
            action = sched.next()
            if action.type == Action.REVERSE:  # the state in hand is u_capo
                with timer("reverse", "reverse"):
                    rev.field = "curr"
                    rev.apply(t_start=sched.capo, t_end=sched.capo + 1)
            elif action.type == Action.REVSTART:  # the state in hand is u_n
                with timer("reverse", "reverse"):
                    rev.field = "prev"
                    rev.apply(t_start=sched.capo, t_end=sched.capo + 1)
            elif action.type == Action.RESTORE:
                with timer("reverse", "restore"):
                    self.load_checkpoint(action.storageIndex())
            elif action.type == Action.ADVANCE:
                with timer("reverse", "advance"):
                    self.fwd_operator.apply(t_start=sched.old_capo, t_end=sched.capo)
            elif action.type == Action.TAKESHOT:
                with timer("reverse", "takeshot"):
                    self.save_checkpoint(action.storageIndex())
            elif action.type == Action.TERMINATE:
                break
            else:
                raise ValueError(f"unexpected pyrevolve action {action}")


class PyrevolveSeismic:
    """The seismic gradient checkpointed by pyrevolve with `snapshots` slots.

    ``run()`` builds a fresh ``Revolver`` (pyrevolve's schedulers are
    stateful: one per gradient), runs ``apply_forward`` and
    ``apply_reverse``, and returns the velocity gradient; ``counts`` then
    holds the forward steps evaluated (``advances`` by the schedule,
    ``taped`` inside reverse steps), the adjoint steps, and the seconds
    pyrevolve's profiler gave its forward advances, its reverse steps
    (taped forward step included) and its storage actions (takeshot,
    restore: the copies into and out of ``NumpyStorage``).
    """

    def __init__(self, problem: SeismicProblem, snapshots: int, taped: bool = True):
        self.problem = problem
        self.snapshots = int(snapshots)
        self.taped = bool(taped)
        self.counts: dict = {}

    def run(self) -> np.ndarray:
        p = self.problem
        live = _Live()
        live.state = p.initial_state()
        fwd, rev = _Forward(live, p), _Reverse(live, p)
        p.reset_gradient()
        cls = pyrevolve.Revolver if self.taped else _UntapedRevolver
        wrp = cls(_WaveCheckpoint(live, p), fwd, rev, self.snapshots, p.nt)
        wrp.apply_forward()
        wrp.apply_reverse()
        taped = rev.calls - 1 if self.taped else 0  # every youturn; not the revstart
        # pyrevolve's own profiler (milliseconds per section and action):
        # "reverse" is the taped forward step (if any) plus the adjoint step.
        ms = wrp.profiler.timings
        seconds = {
            "forward_seconds": 1e-3
            * sum(
                ms.get(sec, {}).get(a, 0.0)
                for sec in ("forward", "reverse")
                for a in ("advance", "lastfw")
            ),
            "reverse_seconds": 1e-3 * ms.get("reverse", {}).get("reverse", 0.0),
            "store_seconds": 1e-3
            * sum(
                ms.get(sec, {}).get(a, 0.0)
                for sec in ("forward", "reverse")
                for a in ("takeshot", "restore", "remove")
            ),
        }
        n_ops = sum(
            wrp.profiler.counts.get(sec, {}).get(a, 0)
            for sec in ("forward", "reverse")
            for a in ("takeshot", "restore")
        )
        seconds["store_ops"] = n_ops
        self.counts = {
            "forward_steps": fwd.steps,
            "advances": fwd.steps - taped,
            "taped": taped,
            "adjoint_steps": rev.calls,
            **seconds,
        }
        return p.gradient
