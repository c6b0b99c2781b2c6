"""Where the states a schedule keeps live, for
:func:`~vlcc_adjoint.torch.checkpoint_sequence` and
:func:`~vlcc_adjoint.torch.checkpoint_sequential`.

Level 0 is a dict of tensor slots (clones on the state's own devices, with
the ``_version`` counters they had when kept, so that a change in place is
caught at ``Load``); level ``k >= 1`` is tier ``k - 1`` of a
:class:`~vlcc_adjoint.storage.TieredStore`.  :class:`Slots` carries out the
storage actions of :mod:`vlcc_adjoint.schedules.actions` (``Save``,
``Load``, ``Delete``, ``Move``) between the two, and records which
``(step, tier)`` records it holds in the store, so that a run can delete
what it left there.  What else a drop-in keeps per state (random generator
states, the structure around the tensors) and on which device a loaded
state lands stay with the drop-in: ``place`` maps the store's tensors back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import VlccRuntimeError

__all__ = ["Slots"]


class Slots:
    """The level-0 slots and the store records of one run.

    **Arguments:**

    - `store`: the :class:`~vlcc_adjoint.storage.TieredStore` of levels
      ``>= 1``, or ``None`` when the schedule uses level 0 only.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.slots: dict[int, tuple] = {}  # level 0: step -> (tensors, versions)
        self.held: set = set()  # (step, store tier) this run has in the store

    def save(self, i: int, level: int, tensors) -> None:
        """``Save(i, level)`` of `tensors` (detached; cloned at level 0)."""
        if level == 0:
            snap = [t.detach().clone() for t in tensors]
            self.slots[i] = (snap, [t._version for t in snap])
        else:
            self.store.save(i, [t.detach() for t in tensors], level - 1)
            self.held.add((i, level - 1))

    def load(self, i: int, level: int, place: Callable, modified: str) -> list[torch.Tensor]:
        """``Load(i, level)``: the slot's tensors, or the store's mapped by `place`.

        **Arguments:** `place` maps the list the store returns to the tensors in
        hand (their devices); `modified` is the ``RuntimeError`` message when a
        slot's tensors were changed in place since they were kept.

        **Returns:** the kept tensors (a slot's own, not copies).
        """
        if level == 0:
            snap, versions = self.slots[i]
            if [t._version for t in snap] != versions:
                raise VlccRuntimeError(modified)
            return snap
        return place(self.store.load(i, level - 1))

    def delete(self, i: int, level: int) -> None:
        """``Delete(i, level)``."""
        if level == 0:
            del self.slots[i]
        else:
            self.store.delete(i, level - 1)
            self.held.discard((i, level - 1))

    def move(self, i: int, src: int, dst: int, place: Callable) -> None:
        """``Move(i, src, dst)``; `place` maps the store's tensors back to a slot."""
        if src >= 1 and dst >= 1:
            self.store.move(i, src - 1, dst - 1)
            self.held.discard((i, src - 1))
            self.held.add((i, dst - 1))
        elif src == 0:
            snap, _ = self.slots.pop(i)
            self.store.save(i, snap, dst - 1)
            self.held.add((i, dst - 1))
        else:
            snap = place(self.store.load(i, src - 1))
            self.slots[i] = (snap, [t._version for t in snap])
            self.store.delete(i, src - 1)
            self.held.discard((i, src - 1))

    def release(self) -> None:
        """Delete every store record this run holds."""
        for step, level in sorted(self.held):
            self.store.delete(step, level)
        self.held.clear()
