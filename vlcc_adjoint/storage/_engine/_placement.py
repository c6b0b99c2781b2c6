"""Placement: which tier a record goes to, and room to stage it.

**Staging.**  A capture for a slower level waits for its background write
*staged*: it counts against ``staging_bytes``, and a ``load`` of it is
served from the staged copy (which never changes, so a read can never see
half a write).  When staging is full, ``save`` waits for the workers (a
*stall*), helping them along (:meth:`~._jobs.Jobs.help`).

**Capacity and spill.**  Every tier enforces ``used_bytes <=
capacity_bytes`` itself (a ``put`` that does not fit raises
:class:`TierFullError` and changes nothing).  ``save`` and ``move`` check
first, counting the bytes of writes still queued for the tier (a
compressed tier: raw size times the ratio seen so far, plus 10% and a
page): if the record does not fit once pending work settles,
``policy="raise"`` raises :class:`StorageError` naming step, level and the
remedy, and ``policy="spill"`` stores it on the next slower tier that has
room (loads find it there).
"""

from __future__ import annotations

import math
import time

from .._tier import StorageError
from ._common import tier_name

__all__ = ["Placement"]


class Placement:
    """Staging room and tier capacity reservations.

    **Arguments:**

    - `shared`: the engine's :class:`~._common.Shared`.
    - `jobs`: its :class:`~._jobs.Jobs` (waiting helps them along).
    - `staging_limit`: the most bytes of captures waiting for their write.
    """

    def __init__(self, shared, jobs, staging_limit: int):
        self.shared = shared
        self.jobs = jobs
        self.staging_limit = staging_limit
        self.staging_used = 0
        self.peak_staging = 0
        self.reserved = [0] * shared.nlv

    def stage(self, nbytes: int) -> None:
        """Lock held: `nbytes` more are staged."""
        self.staging_used += nbytes
        self.peak_staging = max(self.peak_staging, self.staging_used)

    def wait_staging(self, nbytes: int) -> None:
        """Wait (helping the workers) until `nbytes` more fit in staging; a
        capture larger than staging is accepted when nothing else is staged."""
        sh, jobs = self.shared, self.jobs
        with sh.lock:
            if not (self.staging_used > 0 and self.staging_used + nbytes > self.staging_limit):
                return
            t0 = time.perf_counter()
            while (
                self.staging_used > 0
                and self.staging_used + nbytes > self.staging_limit
                and not jobs.failures
            ):
                if not jobs.help(("write",)):
                    sh.changed.wait(0.05)
            sh.t["stall"] += time.perf_counter() - t0
        jobs.raise_failures()

    def estimate(self, k: int, nbytes: int) -> int:
        """The bytes `nbytes` raw bytes will take on tier `k`."""
        c = self.shared.tc[k]
        used = self.shared.tiers[k].used_bytes
        if c.raw_bytes <= 0 or used <= 0 or used >= c.raw_bytes:
            return nbytes
        return min(nbytes, int(math.ceil(nbytes * used / c.raw_bytes * 1.1)) + 4096)

    def unreserve(self, tier: int, nbytes: int) -> None:
        with self.shared.lock:
            self.reserved[tier] -= nbytes

    def place(self, step: int, level: int, nbytes: int) -> tuple[int, int]:
        """The tier to store `nbytes` on (the level, or a slower one when
        spilling) and the bytes reserved there."""
        sh, jobs = self.shared, self.jobs
        candidates = [level]
        if sh.policy == "spill":
            candidates += list(range(level + 1, sh.nlv))
        t0 = None
        notes = []
        try:
            for k in candidates:
                tier = sh.tiers[k]
                cap = tier.capacity_bytes
                with sh.lock:
                    while True:
                        if cap is None:
                            sh.n["spills"] += k != level
                            return k, 0
                        est = self.estimate(k, nbytes)
                        used = tier.used_bytes
                        if used + self.reserved[k] + est <= cap:
                            self.reserved[k] += est
                            sh.n["spills"] += k != level
                            return k, est
                        if jobs.tier_jobs[k] == 0 or jobs.failures:
                            break
                        if t0 is None:
                            t0 = time.perf_counter()
                        # Pending writes and deletes may free room: help them along.
                        if not jobs.help(("write", "delete")):
                            sh.changed.wait(0.05)
                    notes.append(
                        f"level {k} ({tier_name(tier)}): "
                        f"{used} of {cap} B used, {self.reserved[k]} B pending"
                    )
        finally:
            if t0 is not None:
                with sh.lock:
                    sh.t["stall"] += time.perf_counter() - t0
        jobs.raise_failures()
        remedy = (
            "give the tier a larger capacity_bytes, use a schedule with fewer slots on that level"
        )
        remedy += "" if sh.policy == "spill" else ", or construct the store with policy='spill'"
        raise StorageError(
            f"step {step} ({nbytes} B) does not fit on level {level}: "
            f"{'; '.join(notes)}. {remedy[0].upper() + remedy[1:]}"
        )
