"""The Taylor test of a gradient, with a verdict that names what failed.

For a smooth objective ``J`` with gradient ``g`` at ``m`` and a direction
``dm``, the remainders

    r0(h) = |J(m + h dm) - J(m)|                  = O(h)    (if <g, dm> != 0)
    r1(h) = |J(m + h dm) - J(m) - h <g, dm>|      = O(h^2)

shrink, as ``h`` halves, by factors 2 and 4: rates ``log2(r(h) / r(h/2))``
of 1 and 2.  A wrong gradient leaves a first-order term in ``r1``, whose rate
then falls towards 1 as ``h`` shrinks.  At large ``h`` the third-order term
still shows (rates above 2 that converge to 2 as ``h`` halves: 2.22, 2.12,
2.06 ... on the demo's wave problem), and at tiny ``h`` rounding in ``J``
does (rates wander).  So the verdict reads the rates where they have settled,
and is robust at both ends:

1. ``h = h0, h0/2, ..., h0/2^k`` (``h0 = 1/2``: the direction `dm` is
   scaled by the caller so that ``h = 1`` is a modest perturbation);
2. the points whose ``r1`` is above the rounding level of ``J``
   (``ROUNDING * |J|``) are *resolved*; at least three are needed;
3. ``r1`` decreases monotonically over the resolved points;
4. the least-squares slope of ``log r1`` against ``log h`` over the three
   smallest resolved ``h`` lies within ``2 +- band``;
5. over the same points the slope of ``log r0`` lies within ``1 +- band``
   (the direction sees the first-order change of ``J``; otherwise criterion 4
   would not test the gradient at all).

When ``J`` does not change along `dm` at all (a wave that has not yet reached
the perturbation), the test has nothing to measure: it passes if the
gradient predicts no change either, and fails otherwise.

Reference: Farrell, Ham, Funke & Rognes (2013), "Automated derivation of the
adjoint of high-level transient finite element programs", SIAM J. Sci.
Comput. 35(4), section 5 (the Taylor remainder convergence test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = ["TaylorCheck", "taylor_check"]

#: Relative rounding level of an objective value (a sum of many squares):
#: remainders below ``ROUNDING * |J|`` carry no information.
ROUNDING = 1e-11


@dataclasses.dataclass(frozen=True)
class TaylorCheck:
    """The remainders of a Taylor test, their rates and the verdict.

    **Attributes:** `h`, `r0`, `r1` (remainders per step), `rates0`,
    `rates1` (``log2`` ratios of consecutive remainders), `slope0`,
    `slope1` (fitted over the three smallest resolved ``h``; ``nan`` if
    none), `failures` (each failed criterion, in words; empty: passed),
    `note` (how the verdict was reached).
    """

    h: tuple
    r0: tuple
    r1: tuple
    rates0: tuple
    rates1: tuple
    slope0: float
    slope1: float
    failures: tuple
    note: str

    @property
    def passed(self) -> bool:
        return not self.failures


def _rates(r: np.ndarray) -> tuple:
    with np.errstate(divide="ignore", invalid="ignore"):
        return tuple(float(x) for x in np.log2(r[:-1] / r[1:]))


def _slope(h: np.ndarray, r: np.ndarray) -> float:
    return float(np.polyfit(np.log2(h), np.log2(r), 1)[0])


def taylor_check(
    objective: Callable[[np.ndarray], float],
    m: np.ndarray,
    dm: np.ndarray,
    grad: np.ndarray,
    *,
    h0: float = 0.5,
    halvings: int = 5,
    band: float = 0.25,
) -> TaylorCheck:
    """Taylor-test `grad` as the gradient of `objective` at `m` along `dm`.

    **Arguments:**

    - `objective`: ``J(m) -> float``; called ``halvings + 3`` times, the
      last time at `m` (a problem that keeps its model is left at `m`).
    - `m`, `dm`, `grad`: the point, the direction, the gradient to test.
    - `h0`, `halvings`: steps ``h0 / 2^k`` for ``k = 0 .. halvings``.
    - `band`: the tolerance of the fitted rates (2 and 1).

    **Returns:** a :class:`TaylorCheck`; ``.passed``, ``.failures``.
    """
    j0 = float(objective(m))
    slope = float(np.vdot(grad, dm))
    h = h0 * 0.5 ** np.arange(halvings + 1)
    jh = np.array([float(objective(m + hk * dm)) for hk in h])
    objective(m)  # leave the problem at m
    r0 = np.abs(jh - j0)
    r1 = np.abs(jh - j0 - h * slope)
    floor = ROUNDING * max(abs(j0), float(np.abs(jh).max()), np.finfo(float).tiny)
    failures: list[str] = []
    slope0 = slope1 = float("nan")
    if r0.max() <= floor:
        note = "J does not change along dm (to rounding): nothing to measure"
        if np.abs(h * slope).max() > floor:
            failures.append(
                f"J does not change along dm, but the gradient predicts a change "
                f"of {abs(h[0] * slope):.3g} at h = {h[0]:g}"
            )
    else:
        resolved = np.flatnonzero(r1 > floor)
        # Keep the leading run of resolved points: past the first remainder at
        # rounding level the rest are rounding too.
        stop = next((i for i in range(len(h)) if r1[i] <= floor), len(h))
        keep = np.arange(stop)
        note = f"{len(keep)} of {len(h)} steps above the rounding level {floor:.1e}"
        if stop == 0 and resolved.size == 0:
            note = "the second-order remainder is at rounding level at every h"
        elif len(keep) < 3:
            failures.append(
                f"inconclusive: the second-order remainder reaches the rounding "
                f"level of J ({floor:.1e}) after {len(keep)} steps; start from a "
                "larger h"
            )
        else:
            if np.any(np.diff(r1[keep]) >= 0):
                failures.append(
                    "the second-order remainder does not decrease monotonically "
                    f"({', '.join(f'{x:.2e}' for x in r1[keep])})"
                )
            last = keep[-3:]
            slope1 = _slope(h[last], r1[last])
            slope0 = _slope(h[last], r0[last])
            if abs(slope1 - 2.0) > band:
                failures.append(
                    f"the second-order remainder shrinks at rate {slope1:.2f} over "
                    f"h = {h[last[0]]:g} .. {h[last[-1]]:g}, not 2 +- {band}: the "
                    "gradient is wrong"
                )
            if abs(slope0 - 1.0) > band:
                failures.append(
                    f"the first-order remainder shrinks at rate {slope0:.2f} over "
                    f"h = {h[last[0]]:g} .. {h[last[-1]]:g}, not 1 +- {band}: J does "
                    "not change to first order along dm, so the test says nothing"
                )
    return TaylorCheck(
        tuple(float(x) for x in h),
        tuple(float(x) for x in r0),
        tuple(float(x) for x in r1),
        _rates(r0),
        _rates(r1),
        slope0,
        slope1,
        tuple(failures),
        note,
    )
