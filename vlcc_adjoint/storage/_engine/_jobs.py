"""The job queue, the worker threads, and the record of their failures.

Background work (writes to slower levels, read-ahead, deletes) is queued in
one priority queue, earliest need first: deletes (they free room), then
reads and writes by the schedule action index at which their record is
next needed (:meth:`~._clock.PlanClock.priority`); ties in submission order.
Worker threads start with the first job, so a store whose levels are all
in memory never starts one.  With ``workers=0`` every job runs in the call
that submits it (a synchronous store, for baselines and debugging).

A caller that must wait for a job (staging full, a record not yet read)
runs the most urgent matching job itself instead of sleeping (work
stealing, as in Blumofe and Leiserson's scheduler, J. ACM 46(5), 1999):
on a machine with no core to spare for the workers, that is what keeps a
blocked caller from waiting for a thread that cannot run.

A worker never dies with an exception: a failure is recorded with its
step, level and tier, and the next call into the store raises
:class:`StorageError` naming them, the cause chained
(:meth:`Jobs.raise_failures`).
"""

from __future__ import annotations

import heapq
import threading
import time

from .._tier import CorruptCheckpointError, StorageError
from ._common import tier_name

__all__ = ["Jobs"]


class Jobs:
    """The priority queue of background jobs, its workers and failures.

    **Arguments:**

    - `shared`: the engine's :class:`~._common.Shared`.
    - `run`: ``run(kind, entry, slot)``, the job body (``kind`` is
      ``"write"``, ``"read"`` or ``"delete"``); it records its own failures.
    """

    def __init__(self, shared, run):
        self.shared = shared
        self._run = run
        self.heap: list = []
        self.threads: list = []  # started with the first background job
        self.outstanding = 0
        self.tier_jobs = [0] * shared.nlv  # pending writes and deletes per tier
        self.failures: list = []
        self._order = shared.seq

    # -- queue ---------------------------------------------------------------------

    def submit(self, kind, entry, priority, slot=None) -> None:
        """Lock held: queue a job; with ``workers=0`` run it now."""
        sh = self.shared
        self.outstanding += 1
        if kind != "read":
            self.tier_jobs[entry.tier] += 1
        if kind == "write" and entry.done is None:
            entry.done = threading.Event()
        if kind == "delete":
            priority = -1
        if sh.workers == 0:
            sh.lock.release()
            try:
                t0 = time.perf_counter()
                self.run(kind, entry, slot)
                dt = time.perf_counter() - t0
            finally:
                sh.lock.acquire()
            sh.t["io"] += dt
            sh.t["stall"] += dt
            self.done(kind, entry)
            return
        heapq.heappush(self.heap, (priority, next(self._order), kind, slot, entry))
        if not self.threads:
            for k in range(sh.workers):
                th = threading.Thread(target=self._worker, name=f"vlcc-store-{k}", daemon=True)
                th.start()
                self.threads.append(th)
        sh.work.notify()

    def done(self, kind, entry) -> None:
        """Lock held: a job ended."""
        self.outstanding -= 1
        if kind != "read":
            self.tier_jobs[entry.tier] -= 1
        self.shared.changed.notify_all()

    def help(self, kinds, entry=None) -> bool:
        """Lock held: instead of waiting for a worker, run the most urgent
        queued job of `kinds` (for `entry`, if given) in the calling thread.
        Returns whether a job ran."""
        best = None
        heap = self.heap
        for i, job in enumerate(heap):
            if (
                job[2] in kinds
                and (entry is None or job[4] is entry)
                and (best is None or job[:2] < heap[best][:2])
            ):
                best = i
        if best is None:
            return False
        _, _, kind, slot, job_entry = heap.pop(best)
        heapq.heapify(heap)
        lock = self.shared.lock
        lock.release()
        try:
            t0 = time.perf_counter()
            self.run(kind, job_entry, slot)
            dt = time.perf_counter() - t0
        finally:
            lock.acquire()
        self.shared.t["io"] += dt
        self.done(kind, job_entry)
        return True

    def run(self, kind, entry, slot) -> None:
        """Run one job; a failure is recorded, never raised."""
        try:
            self._run(kind, entry, slot)
        except BaseException as exc:
            with self.shared.lock:
                self.record(kind, entry, exc)

    def _worker(self) -> None:
        sh = self.shared
        while True:
            with sh.lock:
                while not self.heap and not sh.stopping:
                    sh.work.wait()
                if sh.stopping:
                    return
                _, _, kind, slot, entry = heapq.heappop(self.heap)
            t0 = time.perf_counter()
            try:
                self.run(kind, entry, slot)
            finally:
                dt = time.perf_counter() - t0
                with sh.lock:
                    sh.t["io"] += dt
                    self.done(kind, entry)

    def pending_steps(self) -> list:
        """Lock held: ``(step, level)`` of the queued jobs, sorted."""
        return sorted({(j[4].step, j[4].level) for j in self.heap})

    def stop(self) -> None:
        """Lock held: tell the workers to exit, dropping queued jobs."""
        self.shared.stopping = True
        self.heap.clear()
        self.shared.work.notify_all()

    def join(self, deadline) -> list[str]:
        """Join the workers by `deadline` (``None``: no limit); the names of
        those still running."""
        for th in self.threads:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            th.join(left)
        return [th.name for th in self.threads if th.is_alive()]

    # -- failures -------------------------------------------------------------------

    def record(self, what, entry, exc) -> None:
        """Lock held: remember a failure of job `what` on `entry`."""
        self.failures.append((what, entry.step, entry.level, self.shared.tiers[entry.tier], exc))

    def raise_failures(self) -> None:
        """Raise the first recorded failure (and count the others), if any."""
        if not self.failures:  # (a failure recorded meanwhile is raised by the next call)
            return
        with self.shared.lock:
            if not self.failures:
                return
            failures, self.failures = self.failures, []
        what, step, level, tier, exc = failures[0]
        more = f" ({len(failures) - 1} more failures after it)" if len(failures) > 1 else ""
        tname = tier_name(tier) if tier is not None else None
        if what == "close":
            if tier is not None:
                msg = f"closing tier {tname!r} (level {level}) failed: {exc!r}"
            else:
                msg = f"close() gave up: {exc}"
        elif what == "save":
            msg = (
                f"saving step {step} to level {level} (tier {tname!r}) failed: "
                f"{type(exc).__name__}: {exc}. The record of step {step} on level {level} "
                "is lost; recompute the state or restart from an earlier checkpoint"
            )
        elif what == "delete":
            msg = (
                f"deleting step {step} from level {level} (tier {tname!r}) "
                f"failed: {type(exc).__name__}: {exc}. The tier may still hold the record "
                "and its bytes; check the tier's path and permissions"
            )
        else:
            msg = (
                f"the background {what} of step {step} to level {level} (tier {tname!r}) "
                f"failed: {type(exc).__name__}: {exc}. The record of step {step} on level "
                f"{level} is lost; check the tier's path, permissions and free space, then "
                "recompute the state or restart from an earlier checkpoint"
            )
        if isinstance(exc, CorruptCheckpointError):
            raise CorruptCheckpointError(msg + more, key=exc.key, tier=exc.tier, step=step) from exc
        raise StorageError(msg + more) from exc

    def after_inline(self) -> None:
        """With ``workers=0`` the jobs ran in the call: report their failures now."""
        if self.failures and self.shared.workers == 0:
            self.raise_failures()
