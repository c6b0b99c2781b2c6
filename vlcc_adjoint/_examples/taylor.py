"""The Taylor test of a gradient, with a verdict that names what failed.

The remainders
--------------
For a smooth objective ``J`` with gradient ``g`` at ``m`` and a direction
``dm``, write ``J(m + h dm) = J(m) + c1 h + c2 h^2 + c3 h^3 + ...`` with
``c1 = <grad J, dm>``.  The signed remainders

    R0(h) = J(m + h dm) - J(m)                    = c1 h + c2 h^2 + ...
    R1(h) = J(m + h dm) - J(m) - h <g, dm>        = (c1 - <g, dm>) h + c2 h^2 + ...

and their sizes ``r0 = |R0|``, ``r1 = |R1|`` shrink, as ``h`` halves, at
rates ``log2(r(h) / r(h/2))``.  If ``g`` is the gradient, the first term of
``R1`` vanishes and ``r1`` shrinks at rate 2 as ``h -> 0`` (faster where
``c2`` is small next to the next term: rate 3 where ``c3 h^3`` dominates).
If it is not, ``R1 ~ e h`` with ``e = c1 - <g, dm> != 0``: ``r1`` shrinks
at rate 1 and ``r1 / h`` tends to ``|e|``.  That is what a wrong gradient
cannot hide, and the test looks for it where it shows: at the smallest
``h`` at which ``r1`` is still measurable.

What makes a fixed range of ``h`` unreliable
--------------------------------------------
- Large ``h``: the higher-order terms.  On the demo's wave problem the
  perturbation shifts travel times, ``J`` is far from quadratic at ``h`` of
  a few percent, and the rates there run from 0.6 to 4 (151 x 201 cells,
  999 steps: 2.97, 3.05, 3.14, 3.32, 3.98, 3.08, 0.64, 1.62, 1.84, ...).
- Cancellations: where ``c2 h^2`` and ``c3 h^3`` have opposite signs,
  ``R1`` crosses zero at ``h* = |c2 / c3|``; just above ``h*`` the rate
  is far above 2, just below far below it (0.64 in the example above), and it
  recovers (1.41, 1.78, 1.90, ... halving from ``h*/2``).  ``R1`` changes sign there,
  which the test sees.
- Small ``h``: rounding.  ``J`` is computed with a relative error of a few
  hundred ``eps`` (a sum of many squares after many steps); once ``r1``
  nears it, its rates wander.

The verdict
-----------
1. ``h = h0, h0/2, ...`` until ``r1`` is at the rounding level
   (``r1 <= rounding * max(|J(m)|, |J(m + h dm)|)``) at two ``h`` in a
   row, or `max_halvings` halvings: the range is chosen by the remainders,
   not fixed in advance.
2. The measurable points are those with ``r1`` above the rounding level;
   they fall into runs of consecutive ``h`` on which ``R1`` keeps its sign.
   A run that begins at a sign change begins at a cancellation: its first
   two points are set aside.
3. The judged window is the last `points` points of the last run that has
   that many (the smallest measurable ``h``).  There the least-squares slope
   of ``log r1`` against ``log h`` must be at least ``2 - band`` (a wrong
   gradient gives 1 there), and the slope of ``log r0`` at least
   ``1 - band`` (``J`` changing slower than ``h`` is not smooth, or is
   noise).  A slope of ``r0`` near 2 means ``J`` is stationary along ``dm``
   at every measurable ``h`` (``c1`` below ``c2 h``: near a minimum): the
   test then confirms only that ``<g, dm>`` is about 0, which it says in
   :attr:`TaylorCheck.caveats` (passed: a wrong gradient that predicts a
   first-order change still fails by the rate of ``r1``).
4. If ``r1`` is at the rounding level at every ``h``, the gradient predicts
   ``J`` along ``dm`` to rounding: passed (a linear objective).  If ``J``
   itself does not change along ``dm``, there is nothing to measure: passed
   when the gradient predicts no change either.  If the measurable points
   form no run long enough, the test is inconclusive, which is a failure
   that says what to change.

The rounding level is relative to ``|J|`` (`rounding`), or an absolute
`floor` where the caller knows better: a misfit ``J = sum (u - d)^2 / 2``
that is a small difference of large fields carries the rounding of each
``u - d`` (``eps |u|``) times ``2 (u - d)``, about ``2 eps sqrt(J E)`` in
all with ``E = sum d^2 / 2`` (Cauchy-Schwarz), far more than ``eps |J|``
when ``J << E``.

Every failure names its criterion.  :attr:`TaylorCheck.gap` is ``r1 / h``
at the smallest judged ``h``, ``|e + c2 h + ...|``: the error ``|e|`` of the
directional derivative when the test fails at rate 1, and when it passes, the
size of an error the test could still have missed.  An error is detectable
when ``e h`` rises above both ``c2 h^2`` and the rounding level at some
``h`` the test reaches, roughly when ``e > 6 sqrt(rounding |J| |c2|)`` (the
window of four points above the rounding level, and the two set aside after
a cancellation, must show it).

Reference: Farrell, Ham, Funke & Rognes (2013), "Automated derivation of the
adjoint of high-level transient finite element programs", SIAM J. Sci.
Comput. 35(4), C369-C393, section 5 (the Taylor remainder convergence test);
the same test as ``taylor_test`` in dolfin-adjoint / pyadjoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["ROUNDING", "TaylorCheck", "judge_remainders", "taylor_check"]

#: Relative rounding level of an objective value (a sum of many squares):
#: remainders at or below ``ROUNDING * |J|`` are not measured.  The demo's
#: wave misfit is computed to a few hundred ``eps`` (1e-13 to 5e-13 of
#: ``|J|`` on grids of 60 x 60 to 151 x 201 cells over 150 to 999 steps), so
#: a remainder above this level is at least 60 times its rounding error, and
#: the rates of the judged window stay within the band with rounding errors
#: up to ``ROUNDING / 8`` (a lower level would let rounding errors of
#: ``ROUNDING / 5`` fail correct gradients; a higher one would miss smaller
#: errors of the gradient).
ROUNDING = 3e-11

#: Halvings of ``h`` before the test stops if ``r1`` never reaches the
#: rounding level (a wrong gradient's ``r1 ~ e h`` takes about 30 from a
#: ``J``-sized start): ``h`` goes down to ``h0 / 2^30``.
MAX_HALVINGS = 30


@dataclasses.dataclass(frozen=True)
class TaylorCheck:
    """The remainders of a Taylor test, their rates and the verdict.

    **Attributes:**

    - `h`, `r0`, `r1`: the steps and the remainders' sizes at each.
    - `rates0`, `rates1`: ``log2`` ratios of consecutive remainders.
    - `floor`: the rounding level of each ``r1``.
    - `window`: ``(first, last)`` indices of the judged points, or ``None``.
    - `caveats`: what a passed test did not check (``J`` stationary along
      ``dm``), in words.
    - `slope0`, `slope1`: the fitted rates over the window (``nan``: none).
    - `gap`: ``r1 / h`` at the window's smallest ``h``: about
      ``|<grad J, dm> - <g, dm>|`` if the test failed at rate 1, the size of
      an error it could have missed if it passed (``nan``: no window).
    - `failures`: each failed criterion, in words (empty: passed).
    - `note`: how the verdict was reached.
    """

    h: tuple[float, ...]
    r0: tuple[float, ...]
    r1: tuple[float, ...]
    rates0: tuple[float, ...]
    rates1: tuple[float, ...]
    floor: tuple[float, ...]
    window: tuple[int, int] | None
    caveats: tuple[str, ...]
    slope0: float
    slope1: float
    gap: float
    failures: tuple[str, ...]
    note: str

    @property
    def passed(self) -> bool:
        return not self.failures


def _rates(r: np.ndarray) -> tuple[float, ...]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return tuple(float(x) for x in np.log2(r[:-1] / r[1:]))


def _slope(h: np.ndarray, r: np.ndarray) -> float:
    return float(np.polyfit(np.log2(h), np.log2(r), 1)[0])


def _floor(j0: float, jh: np.ndarray, rounding: float, floor: float) -> np.ndarray:
    scale = rounding * np.maximum(abs(j0), np.abs(jh))
    return np.maximum(np.maximum(scale, floor), np.finfo(float).tiny)


def _runs(resolved: np.ndarray, sign: np.ndarray) -> list[np.ndarray]:
    """The usable points of each run of consecutive resolved points on which
    ``R1`` keeps its sign; a run that starts at a sign change (its
    predecessor resolved, of the other sign) loses its first two points."""
    runs: list[np.ndarray] = []
    start = None
    for i in range(len(resolved) + 1):
        breaks = (
            i == len(resolved) or not resolved[i] or (start is not None and sign[i] != sign[start])
        )
        if start is not None and breaks:
            after_crossing = start > 0 and resolved[start - 1]
            runs.append(np.arange(start + (2 if after_crossing else 0), i))
            start = None
        if i < len(resolved) and resolved[i] and start is None:
            start = i
    return runs


def judge_remainders(
    steps: Sequence[float],
    j0: float,
    values: Sequence[float],
    slope: float,
    *,
    band: float = 0.25,
    points: int = 4,
    rounding: float = ROUNDING,
    floor: float = 0.0,
) -> TaylorCheck:
    """The verdict of a Taylor test from its objective values (module docstring).

    **Arguments:**

    - `steps`: the steps ``h``, decreasing (each half the previous one).
    - `j0`, `values`: ``J(m)``, and ``J(m + h dm)`` at each step (a
      non-finite value marks a step as not measurable).
    - `slope`: ``<g, dm>``, the gradient's prediction of ``dJ/dh``.
    - `band`: the tolerance of the fitted rates (at least 2, and 1).
    - `points`: how many points the judged window holds (``>= 3``).
    - `rounding`: the relative rounding level of ``J`` (:data:`ROUNDING`).
    - `floor`: an absolute rounding level of differences of ``J``, when it
      is larger than ``rounding |J|`` (module docstring); default 0.

    **Returns:** a :class:`TaylorCheck`; ``.passed``, ``.failures``.
    """
    h = np.asarray(steps, dtype=float)
    jh = np.asarray(values, dtype=float)
    finite = np.isfinite(jh)
    R0 = jh - j0
    R1 = R0 - h * slope
    r0, r1 = np.abs(R0), np.abs(R1)
    levels = _floor(j0, jh, rounding, floor)
    resolved = finite & (r1 > levels)
    failures: list[str] = []
    caveats: list[str] = []
    window = None
    slope0 = slope1 = gap = float("nan")
    moves = finite & (r0 > levels)
    if not moves.any():
        note = "J does not change along dm (to rounding): nothing to measure"
        predicted = np.abs(h * slope)
        if (predicted > levels).any():
            k = int(np.argmax(predicted > levels))
            failures.append(
                f"J does not change along dm, but the gradient predicts a change of "
                f"{predicted[k]:.3g} at h = {h[k]:g}: <g, dm> = {slope:.3g} should be 0"
            )
    elif not resolved.any():
        note = (
            "the second-order remainder is at rounding level at every h: the gradient "
            "predicts J along dm to rounding"
        )
    else:
        usable = [run for run in _runs(resolved, np.sign(R1)) if len(run) >= points]
        if not usable:
            last = int(np.flatnonzero(resolved)[-1])
            failures.append(
                "inconclusive: the second-order remainder is above the rounding level "
                f"({levels[last]:.1e}) at too few consecutive steps of one sign to show a "
                f"rate (down to h = {h[last]:g}); J may be noisier than that or not smooth "
                "along dm: give a smaller rounding level if J is computed more accurately, "
                "or test another direction"
            )
            note = f"{int(resolved.sum())} of {len(h)} steps above the rounding level"
        else:
            sel = usable[-1][-points:]
            window = (int(sel[0]), int(sel[-1]))
            slope1 = _slope(h[sel], r1[sel])
            slope0 = _slope(h[sel], r0[sel])
            gap = float(r1[sel[-1]] / h[sel[-1]])
            span = f"h = {h[sel[0]]:.3g} .. {h[sel[-1]]:.3g}"
            note = (
                f"judged over {span}, the smallest steps at which the second-order "
                f"remainder is above the rounding level and of one sign"
            )
            relative = f" ({gap / abs(slope):.1e} of it)" if slope else ""
            if slope1 < 2.0 - band:
                failures.append(
                    f"the second-order remainder shrinks at rate {slope1:.2f} over {span}, "
                    f"not 2 or more: the gradient is wrong (a first-order term remains: "
                    f"<g, dm> = {slope:.6g} is off by about {gap:.3g}{relative})"
                )
            if slope0 < 1.0 - band:
                failures.append(
                    f"the first-order remainder shrinks at rate {slope0:.2f} over {span}, "
                    f"less than 1 - {band}: J does not change smoothly along dm (or its "
                    "rounding is larger than the rounding level assumed); test another "
                    "direction, or give the rounding level"
                )
            elif slope0 > 1.0 + band:
                caveats.append(
                    f"J is stationary along dm at the measurable steps (the first-order "
                    f"remainder shrinks at rate {slope0:.2f}, not 1): the test confirms only "
                    f"that <g, dm> is about 0 (|<g, dm>| = {abs(slope):.3g}, r1 / h = "
                    f"{gap:.3g}); another direction would test the gradient's other components"
                )
    return TaylorCheck(
        h=tuple(float(x) for x in h),
        r0=tuple(float(x) for x in r0),
        r1=tuple(float(x) for x in r1),
        rates0=_rates(r0),
        rates1=_rates(r1),
        floor=tuple(float(x) for x in levels),
        window=window,
        caveats=tuple(caveats),
        slope0=slope0,
        slope1=slope1,
        gap=gap,
        failures=tuple(failures),
        note=note,
    )


def taylor_check(
    objective: Callable[[np.ndarray], float],
    m: np.ndarray,
    dm: np.ndarray,
    grad: np.ndarray,
    *,
    h0: float = 0.5,
    max_halvings: int = MAX_HALVINGS,
    band: float = 0.25,
    points: int = 4,
    rounding: float = ROUNDING,
    floor: float = 0.0,
) -> TaylorCheck:
    """Taylor-test `grad` as the gradient of `objective` at `m` along `dm`.

    **Arguments:**

    - `objective`: ``J(m) -> float``; called once at `m`, at each step, and
      once more at `m` at the end (a problem that keeps its model is left
      at `m`).
    - `m`, `dm`, `grad`: the point, the direction, the gradient to test.
      Scale `dm` so that ``h = 1`` is a modest perturbation.
    - `h0`: the first step; it is halved until the second-order remainder
      reaches the rounding level twice in a row, at most `max_halvings`
      times.
    - `band`, `points`, `rounding`, `floor`: as for :func:`judge_remainders`.

    **Returns:** a :class:`TaylorCheck`; ``.passed``, ``.failures``.
    """
    j0 = float(objective(m))
    slope = float(np.vdot(grad, dm))
    h: list[float] = []
    jh: list[float] = []
    at_floor = 0
    for k in range(max_halvings + 1):
        step = h0 * 0.5**k
        value = float(objective(m + step * dm))
        h.append(step)
        jh.append(value)
        level = _floor(j0, np.array([value]), rounding, floor)[0]
        below = not np.isfinite(value) or abs(value - j0 - step * slope) <= level
        at_floor = at_floor + 1 if below and np.isfinite(value) else 0
        if at_floor == 2:
            break
    objective(m)  # leave the problem at m
    return judge_remainders(
        h, j0, jh, slope, band=band, points=points, rounding=rounding, floor=floor
    )
