"""The gradient-error budget: error bounds of lossy checkpoints chosen from
the accuracy the gradient needs.

A user of error-bounded compression knows how accurate the *gradient* must
be, not what an absolute error of ``1e-4`` on a state does to it.
``run_adjoint(..., gradient_rtol=rtol)`` turns the first into the second:
it runs the adjoint under bounds it chooses and returns a gradient ``g~``
with an estimate of ``||g~ - g|| / ||g||``, ``g`` the gradient of the same
schedule with every checkpoint stored exactly.

The model (first order)
-----------------------
Every checkpoint ``u_c`` on a lossy level is stored as ``u_c + e_c`` with
``|e_c| <= tau max|u_c|`` elementwise (a bound *relative* to each leaf's
largest magnitude, :meth:`CompressedMemoryTier.set_error_bound`).  The
states recomputed from it, the adjoint steps that read them, and so the
gradient, are smooth functions of ``e_c``; to first order

    g~ - g = sum_c S_c e_c + O(tau^2),        S_c = d g / d u_c  (through the
                                               recomputation from u_c),

and the quantisation errors of an error-bounded codec are, to a good
approximation, uniform noise of width proportional to the bound (Widrow &
Kollar, *Quantization Noise*, 2008, ch. 4-5): ``e_c = tau xi_c`` with a
``xi_c`` whose statistics do not depend on ``tau``.  Hence

    ||g~(tau) - g|| / ||g|| ~= K tau,                                   (1)

with a *sensitivity* ``K`` of the problem, its schedule and its data,
constant over the range of bounds where (1) holds.  The noise assumption
needs the dither of :class:`CompressedMemoryTier`'s relative bounds (each
checkpoint quantised on its own lattice, see its module): without it the
errors of smooth regions are coherent biases and ``K`` jumps between
neighbouring bounds.  Measured on the examples' seismic and Burgers
problems, ``||g~ - g|| / (||g|| tau)`` stays within a factor of 3 to 8
over eight decades of ``tau`` (no trend, a spread), and ``K`` differs by a
factor of a thousand between them: no fixed bound suits both.

Estimating K without the exact gradient
---------------------------------------
The exact gradient is what the run cannot afford (it would need every
checkpoint stored exactly).  Two lossy runs suffice.  Let ``d = g~(t1) -
g~(t2)``.  If (1) holds for the norms, whatever the directions of the two
errors, the triangle inequality gives, for ``t2 != t1``,

    ||g~(t2) - g|| <= ||d|| t2 / |t1 - t2|,                              (2)

(from ``||delta_2|| <= ||d|| + ||delta_1||`` and ``||delta_1|| = (t1 / t2)
||delta_2||`` when ``t1 < t2``, and symmetrically otherwise), which is the
first-order Richardson estimate of the error (Richardson & Gaunt, Phil.
Trans. R. Soc. A 226, 1927) made one-sided: it also holds when the two
errors are independent, where it overestimates by at most
``sqrt(r^2 + 1) / (r - 1)`` for ``r = t1 / t2``.  So ``K_hat = ||d|| /
(|t1 - t2| ||g~(t2)||)``.

The controller
--------------
1. *Pilot*: two runs at ``t_a = min(PILOT_RATIO rtol, MAX_BOUND)`` and
   ``t_b = t_a / PILOT_RATIO``, giving ``K_hat`` by (2).
2. *Choice*: the largest bound with a predicted error ``SAFETY`` times
   below the budget, ``t* = rtol / (SAFETY K_hat)`` (at most
   ``MAX_BOUND``; ``K_hat = 0``, when the lossy checkpoints did not change
   the gradient, gives ``MAX_BOUND``).  If the second pilot is already
   within a factor 2 below ``t*``, it is the result: it is the run that ran
   last, so a gradient the solver accumulates is its gradient.
3. *Run and check a posteriori*: a run at ``t*``; (2) over the pairs of it
   and each earlier run (bounds at least ``MIN_PAIR_RATIO`` apart) updates
   ``K_hat`` (the largest estimate is kept: a sensitivity that grows as
   the bound shrinks, where (1) fails, shows in the pair nearest in bound)
   and gives the run's estimate ``K_hat t*``.
   If that exceeds ``rtol``, the run is repeated at the tighter
   ``rtol / (SAFETY K_hat)``, at most :data:`MAX_RUNS` runs in all; then
   a ``RuntimeError`` (a :class:`~vlcc_adjoint.VlccError`).

``SAFETY`` covers the spread of ``K`` from one bound to the next: each
run's error is one draw of a sum dominated by a few checkpoints, and on a
seismic problem with 6 snapshots over 250 steps ``K`` ranged over
85 .. 640 across 25 bounds from 1e-1 to 1e-7.  With ``SAFETY = 8``, 42
controlled runs (six Burgers and seismic configurations, budgets 3e-2 ..
1e-5) all met their budget, the largest error 0.67 of it; with 4, three
exceeded it by up to 10%.  The estimate is first order, so it is an
estimate, not a bound: the tests check the achieved error against exact
runs on both examples at budgets ``1e-2 .. 1e-4``.  The a-posteriori check
sees a sensitivity that grows below the pilots' bounds only when the run's
error outgrows the pilots' (its difference to them then exceeds what (1)
allows); a smaller jump is left to ``SAFETY``.

The cost is two to four runs of the schedule instead of one (at most
:data:`MAX_RUNS`; the pilots compress more, so they fit wherever the final
run does).
Each run writes synchronously (``TieredStore(workers=0)``): every
checkpoint on a lossy level is then read back decoded, so the estimate
describes what ran (an asynchronous store serves some loads from the exact
staged capture, which makes the error smaller but irreproducible).

Only the levels of the run's store with an ``ErrorBounded`` codec are
lossy, and only for the checkpoints of this run, which are recomputation
checkpoints; ``u_n``, ``lambda_0``, restart checkpoints
(:mod:`vlcc_adjoint.storage.format`, zarr tiers) and lineage versions
(:mod:`vlcc_adjoint.lineage`) are never lossy.

References: S. Di, F. Cappello, "Fast error-bounded lossy HPC data
compression with SZ", IPDPS 2016 (value-range-relative bounds); N. Kukreja,
J. Hueckelheim, M. Louboutin, J. Washbourne, P. H. J. Kelly, G. J. Gorman,
"Lossy checkpoint compression in full waveform inversion: a case study
with ZFPv0.5.5 and the overthrust model", GMD 15:3815, 2022 (the effect of
compression errors on FWI gradients, with bounds fixed by hand).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import VlccError, VlccValueError

__all__ = ["BudgetRun", "ErrorBudgetReport", "check_rtol", "controlled_run", "lossy_levels"]

#: The chosen bound predicts an error this many times below the budget
#: (the spread of ``K`` between neighbouring bounds, measured up to 7.5x).
SAFETY = 8.0
#: Ratio of the two pilot bounds, and of the first pilot bound to ``rtol``.
PILOT_RATIO = 10.0
#: The largest relative bound used (beyond it the first-order model fails).
MAX_BOUND = 0.1
#: Two runs whose bounds are closer than this ratio are not compared by (2)
#: (its denominator ``|t1 - t2|`` would magnify their noise).
MIN_PAIR_RATIO = 1.5
#: Runs of the schedule, pilots included, before the controller gives up.
MAX_RUNS = 6


class _ErrorBudgetNotMet(VlccError, RuntimeError):
    """The gradient's error could not be brought within the budget (catch it
    as ``RuntimeError`` or :class:`~vlcc_adjoint.VlccError`)."""


@dataclasses.dataclass(frozen=True)
class BudgetRun:
    """One run of the schedule under the error budget.

    **Attributes:**

    - `bound`: the relative error bound ``tau`` of the lossy levels.
    - `error_estimate`: the estimate of the gradient's relative error
      (``None`` for the first pilot, which has nothing to compare with).
    - `compression_ratio`: raw over encoded bytes of every checkpoint the
      lossy levels stored in this run.
    - `seconds`: its wall time.
    """

    bound: float
    error_estimate: float | None
    compression_ratio: float | None
    seconds: float


@dataclasses.dataclass(frozen=True)
class ErrorBudgetReport:
    """How ``run_adjoint(..., gradient_rtol=...)`` met its budget.

    **Attributes:**

    - `rtol`: the budget on ``||g~ - g|| / ||g||``.
    - `bound`: the relative bound of the run returned
      (``|e| <= bound max|u|`` for each checkpointed leaf ``u``).
    - `error_estimate`: the estimated relative error of its gradient.
    - `compression_ratio`: raw over encoded bytes on the lossy levels in it.
    - `sensitivity`: ``K_hat``, the estimated relative gradient error per
      unit of relative bound.
    - `runs`: every run, pilots first (:class:`BudgetRun`).
    - `forward_steps`, `wall_seconds`: totals over all runs.
    """

    rtol: float
    bound: float
    error_estimate: float
    compression_ratio: float | None
    sensitivity: float
    runs: tuple[BudgetRun, ...]
    forward_steps: int
    wall_seconds: float


def check_rtol(rtol: Any) -> float:
    """`rtol` as a float in ``(0, 1)``, or a ``ValueError`` saying what to pass."""
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.integer, np.floating)):
        raise VlccValueError(f"gradient_rtol must be a number in (0, 1), e.g. 1e-3, got {rtol!r}")
    value = float(rtol)
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise VlccValueError(
            f"gradient_rtol must be a finite number in (0, 1) (the gradient's relative L2 error "
            f"against lossless checkpoints, e.g. 1e-3), got {rtol!r}; for exact checkpoints "
            "leave it out (None)"
        )
    return value


def lossy_levels(tiers: Sequence[Any]) -> list[int]:
    """The levels whose error bound the controller sets.

    **Arguments:**

    - `tiers`: the store's tiers, level by level.

    **Returns:** the indices of the tiers with an ``ErrorBounded`` codec
    (``error_bound`` not ``None`` and a ``set_error_bound`` method).

    **Raises:** ``ValueError`` if there is none, or if a level is lossy
    without a settable bound (``FixedRate``): both say what to change.
    """
    levels = []
    for k, tier in enumerate(tiers):
        settable = callable(getattr(tier, "set_error_bound", None))
        if settable and getattr(tier, "error_bound", None) is not None:
            levels.append(k)
        elif getattr(tier, "lossy", False):
            raise VlccValueError(
                f"level {k} ({tier!r}) is lossy without an error bound the gradient budget can "
                "set; use CompressedMemoryTier(ErrorBounded(1e-3)) there, or leave gradient_rtol "
                "out"
            )
    if not levels:
        names = ", ".join(type(t).__name__ for t in tiers)
        raise VlccValueError(
            f"gradient_rtol sets the error bound of lossy checkpoint levels, and this store has "
            f"none (levels: {names}); give a level CompressedMemoryTier(ErrorBounded(1e-3)) "
            "(the bound is then chosen for you), pass store=None to let run_adjoint build "
            "compressed levels, or leave gradient_rtol out for exact checkpoints"
        )
    return levels


def _leaves(x) -> list[np.ndarray]:
    from .state import flatten

    leaves, _ = flatten(x)
    out = []
    for leaf in leaves:
        x = np.asarray(leaf)
        out.append(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64).reshape(-1))
    return out


def _norm(leaves: list[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.vdot(x, x).real) for x in leaves))


def _distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.vdot(x - y, x - y).real) for x, y in zip(a, b)))


def _bytes_put(tiers, levels) -> tuple[int, int]:
    raw = enc = 0
    for k in levels:
        r, e = tiers[k].bytes_put
        raw, enc = raw + r, enc + e
    return raw, enc


def controlled_run(
    run_once: Callable[[], Any],
    tiers: Sequence[Any],
    rtol: float,
    gradient: Callable[[Any], Any],
    reset: Callable[[], None] | None,
) -> tuple[Any, ErrorBudgetReport]:
    """Run the schedule until a gradient is within the budget (module docstring).

    **Arguments:**

    - `run_once`: runs the schedule once on `tiers` and returns its result.
    - `tiers`: the store's tiers (:func:`lossy_levels` picks the lossy ones).
    - `rtol`: the budget (:func:`check_rtol`).
    - `gradient`: ``gradient(result)``: the quantity under the budget.
    - `reset`: called before each run (zero a gradient the solver
      accumulates), or ``None``.

    **Returns:** ``(result, report)``: the last run's result, whose gradient
    is the one returned, and an :class:`ErrorBudgetReport`.
    """
    levels = lossy_levels(tiers)
    runs: list[BudgetRun] = []
    grads: list[tuple[float, list[np.ndarray]]] = []
    forward_steps: list[int] = []  # of each run; its seconds are in runs

    def attempt(bound: float):
        if len(runs) >= MAX_RUNS:
            raise _ErrorBudgetNotMet(
                f"the gradient's estimated relative error stayed above gradient_rtol={rtol:g} "
                f"after {MAX_RUNS} runs (bounds and estimates: "
                + ", ".join(f"{r.bound:.3g}: {r.error_estimate}" for r in runs)
                + "); the error does not fall with the bound as a first-order model says "
                "(a chaotic or non-smooth problem?): use lossless checkpoints"
            )
        for k in levels:
            tiers[k].set_error_bound(relative=bound)
        if reset is not None:
            reset()
        before = _bytes_put(tiers, levels)
        t0 = time.perf_counter()
        result = run_once()
        seconds = time.perf_counter() - t0
        after = _bytes_put(tiers, levels)
        enc = after[1] - before[1]
        ratio = (after[0] - before[0]) / enc if enc > 0 else None
        forward_steps.append(result.forward_steps)
        value = gradient(result)
        if value is None:
            raise VlccValueError(
                "gradient_rtol measures the gradient, and this run returned none (lambda_0 is "
                "None: the solver keeps its adjoint in its own fields): pass gradient=lambda: "
                "... (the gradient's data) and reset_gradient=... (zero it and the adjoint "
                "fields before each run)"
            )
        grads.append((bound, _leaves(value)))
        return result, ratio, seconds

    def estimate(index: int) -> float:
        """K_hat from run `index` and each earlier run, by (2): the largest."""
        bound, g = grads[index]
        norm = _norm(g)
        if norm == 0.0:
            raise _ErrorBudgetNotMet(
                "the gradient is zero, so its relative error is undefined; gradient_rtol needs "
                "a nonzero gradient (check the objective and the seed adj_final)"
            )
        pairs = [
            (other, h)
            for other, h in grads[:index]
            if max(other, bound) >= MIN_PAIR_RATIO * min(other, bound)
        ]
        return max(_distance(g, h) / (abs(other - bound) * norm) for other, h in pairs)

    t_a = min(PILOT_RATIO * rtol, MAX_BOUND)
    t_b = t_a / PILOT_RATIO
    _, ratio, seconds = attempt(t_a)
    runs.append(BudgetRun(t_a, None, ratio, seconds))
    result, ratio, seconds = attempt(t_b)
    k_hat = estimate(1)
    runs.append(BudgetRun(t_b, k_hat * t_b, ratio, seconds))
    bound = t_b
    target = MAX_BOUND if k_hat == 0.0 else min(rtol / (SAFETY * k_hat), MAX_BOUND)
    if not target / 2.0 <= t_b <= target:
        while True:
            bound = target
            result, ratio, seconds = attempt(bound)
            k_hat = max(k_hat, estimate(len(grads) - 1))
            runs.append(BudgetRun(bound, k_hat * bound, ratio, seconds))
            if k_hat * bound <= rtol:
                break
            target = rtol / (SAFETY * k_hat)
    final = runs[-1]
    report = ErrorBudgetReport(
        rtol=rtol,
        bound=bound,
        error_estimate=k_hat * bound,
        compression_ratio=final.compression_ratio,
        sensitivity=k_hat,
        runs=tuple(runs),
        forward_steps=sum(forward_steps),
        wall_seconds=sum(r.seconds for r in runs),
    )
    return result, report
