"""The block size and Revolve snapshots for :func:`checkpoint_sequence`
under a memory budget counted in states (plain Python: no torch needed)."""

from __future__ import annotations

import dataclasses

from ..errors import VlccValueError
from ..schedules import binomial_forward_count

__all__ = ["SequencePlan", "plan_sequence"]


@dataclasses.dataclass(frozen=True)
class SequencePlan:
    """A (block, snapshots) choice for :func:`checkpoint_sequence` (see :func:`plan_sequence`).

    **Attributes:** `block` and `snapshots` (pass them as ``block=`` and
    ``snapshots=``), `recomputed` (step evaluations beyond plain autograd's
    ``n``: untaped forward steps, Revolve's forward count times the block),
    `memory` (snapshots + one block's tape, in states).
    """

    block: int
    snapshots: int
    recomputed: int
    memory: float


def plan_sequence(steps: int, memory: float, tape: float = 1.0) -> SequencePlan:
    """The block size and Revolve snapshots that recompute least within `memory`.

    A chain of ``n`` steps under ``Revolve(ceil(n / k), c)`` over blocks of
    ``k`` steps keeps ``c`` snapshots (``u_0`` included) and the tape of one
    block, ``k * tape`` states; it evaluates ``k * t(ceil(n / k), c)`` steps
    without grad besides the ``n`` taped ones (``t`` is Griewank's binomial
    forward count).  This minimises that over ``k`` (``k = n / s`` with
    ``c = s`` is ``checkpoint_sequential`` with ``s`` segments, so the plan
    never recomputes more than the best ``checkpoint_sequential`` that fits).

    **Arguments:**

    - `steps`: ``n``.
    - `memory`: the budget, in states (bytes of the state = 1): snapshots
      plus one block's tape.  Allow ~2 more for the state in hand and the
      cotangent.
    - `tape`: the bytes autograd saves for one step, in states (an RNN cell
      saves about one state: its ``tanh`` output; an MLP block more).

    **Returns:** a :class:`SequencePlan`; ``ValueError`` if not even one
    snapshot and a one-step tape fit.
    """
    n = int(steps)
    if n < 1:
        raise VlccValueError(f"steps must be >= 1, got {steps!r}")
    if not tape > 0:
        raise VlccValueError(f"tape must be > 0, got {tape!r}")
    best = None
    k = 1
    while k <= n and 1 + k * tape <= memory:
        m = -(-n // k)
        c = min(int(memory - k * tape), m)
        evals = k * binomial_forward_count(m, c) if m > 1 else 0
        cand = (evals, c + k * tape, k, c)
        if best is None or cand < best:
            best = cand
        k += 1
    if best is None:
        raise VlccValueError(
            f"memory={memory} states cannot hold a snapshot and a one-step tape of {tape} states"
        )
    evals, mem, k, c = best
    return SequencePlan(block=k, snapshots=c, recomputed=evals, memory=mem)
