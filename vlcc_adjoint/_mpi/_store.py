"""DistributedStore: a rank's asynchronous store, one shared hierarchy, collective commits.

Every rank runs its own :class:`~vlcc_adjoint.storage.TieredStore` over its
own tiers (memory levels hold its blocks; a
:class:`~vlcc_adjoint.mpi.SharedZarrTier` level writes them into the one
hierarchy all ranks share), so capture, background writes, prefetching and
Belady eviction run per rank exactly as in a serial run, with no MPI on the
worker threads.  This class adds what only the ranks together can do, all
of it on the caller's thread, where every rank makes the same calls in the
same order (the schedule is verified identical on every rank):

* **Chunk-aligned layout** (``save``/``load``).  A
  :class:`~vlcc_adjoint.mpi.DistributedArray` whose decomposition does not
  align with a coarse chunk grid (``numpy.array_split`` blocks of unequal
  size: see :func:`~vlcc_adjoint.mpi.storage_layout`) is moved, before it
  is saved, to the aligned decomposition over the same process grid:
  point-to-point messages carry only the slivers that differ between the
  two layouts (a few rows per boundary), and a load moves them back.
  Aligned decompositions (:meth:`Decomposition.aligned`, or equal blocks)
  cost nothing here.  The layout is the same on every level, so the
  engine's ``Move`` between levels needs no communication.
* **Collective commit** (:meth:`commit`; at :meth:`close`; every
  `commit_every` saves to a shared level): flush this rank's writes, agree
  that every rank succeeded, then publish the records
  (:meth:`SharedZarrTier.commit`).  A failure on any rank is the same
  :class:`~vlcc_adjoint.mpi.AgreedError` on every rank.
* **A guard** (:class:`~vlcc_adjoint.mpi.Guard`): every wait above has a
  deadline and watches the run's error channel, so no rank hangs when
  another fails.  ``vlcc_adjoint.mpi.run_adjoint`` runs under this guard.

Commit cost: the flush (the store's ``wait``) plus four small reductions,
a gather of one 8-byte checksum per chunk to rank 0 and rank 0's metadata
writes (one ``zarr.json`` per leaf and record, one rename per record).
``commit_every=None`` (default) commits only at :meth:`close`, which is
what a checkpointed adjoint needs (its records live only during the run);
set it to make records restart points during a long forward sweep.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import VlccValueError
from ..state import flatten, unflatten
from ..storage import TieredStore
from ._comm import Guard, redistribute
from ._decomp import Decomposition, distributed_nodes, storage_layout
from ._zarr import SharedZarrTier

if TYPE_CHECKING:
    from ..schedules import IOPlan
    from ..storage import StoreStats, Tier

__all__ = ["DistributedStore", "write_checkpoint"]


class _Layouts:
    """Decomposition -> storage decomposition, cached."""

    def __init__(self, max_chunks_per_block: int):
        self.max_chunks = max_chunks_per_block
        self._cache: dict[Decomposition, Decomposition] = {}
        self._json: dict[str, Decomposition] = {}

    def parse(self, doc) -> Decomposition:
        key = repr(doc)
        d = self._json.get(key)
        if d is None:
            d = self._json[key] = Decomposition.from_json(doc)
        return d

    def storage(self, d: Decomposition) -> Decomposition:
        s = self._cache.get(d)
        if s is None:
            s = self._cache[d] = storage_layout(d, self.max_chunks)[0]
        return s


def _move(guard: Guard, layouts: _Layouts, state, *, back: bool):
    """`state` with its DistributedArray blocks moved to (or, `back`, from)
    their storage layouts; `state` itself when nothing moves."""
    leaves, spec = flatten(state)
    groups: dict[tuple, list] = {}
    for node in distributed_nodes(spec["tree"]):
        aux = node["aux"]
        leaf = node["items"][0]["leaf"]
        if back:
            if "origin" not in aux:
                continue
            src, dst = layouts.parse(aux["decomposition"]), layouts.parse(aux["origin"])
        else:
            if "origin" in aux:
                continue
            src = layouts.parse(aux["decomposition"])
            dst = layouts.storage(src)
            if dst == src:
                continue
        groups.setdefault((src, dst), []).append((node, leaf))
    if not groups:
        return state, False
    leaves = list(leaves)
    for (src, dst), items in groups.items():
        moved = redistribute(guard, [leaves[i] for _, i in items], src, dst)
        for (node, i), arr in zip(items, moved):
            leaves[i] = arr
            spec["leaves"][i]["shape"] = list(arr.shape)
            node["aux"]["decomposition"] = dst.to_json()
            if back:
                node["aux"].pop("origin")
            else:
                node["aux"]["origin"] = src.to_json()
    return unflatten(spec, leaves), True


class DistributedStore:
    """A rank's :class:`~vlcc_adjoint.storage.TieredStore` in an SPMD run.

    **Arguments:**

    - `comm`: the mpi4py communicator of the run (every rank builds its
      store at the same point: construction is collective).
    - `tiers`: this rank's storage levels, fastest first (memory tiers,
      :class:`SharedZarrTier` for the shared persistent level).
    - `plan`: the schedule's ``io_plan`` (prefetching and eviction), as for
      ``TieredStore``.
    - `timeout`: the most seconds any collective wait may last;
      `abort_after`: how long a failed rank waits for the others to
      acknowledge before ``MPI_Abort`` (see :class:`~vlcc_adjoint.mpi.Guard`).
    - `commit_every`: commit after every this many saves to a shared level
      (``None``: at :meth:`commit` and :meth:`close` only).
    - `max_chunks_per_block`: see :func:`~vlcc_adjoint.mpi.storage_layout`.
    - `**options`: passed to ``TieredStore`` (``prefetch_bytes``,
      ``staging_bytes``, ``workers``, ``policy``, ``dedup``, ...).

    It has ``TieredStore``'s methods (``save``, ``load``, ``delete``,
    ``move``, ``sync``, ``wait``, ``stats``, ``steps``, ``reserve``) and
    :meth:`commit`.  Pass it to ``run_adjoint(..., comm=comm)``, which
    commits and closes it collectively when the run succeeds and only
    locally when a rank failed (the serial executor, without ``comm``,
    would close it collectively in both cases, and a failure on one rank
    would then end in the others' timeout rather than at once).
    """

    def __init__(
        self,
        comm: Any,
        tiers: Sequence[Tier],
        plan: IOPlan | None = None,
        *,
        timeout: float | None = 600.0,
        abort_after: float | None = None,
        commit_every: int | None = None,
        max_chunks_per_block: int = 4,
        **options: Any,
    ):
        if commit_every is not None and (not isinstance(commit_every, int) or commit_every < 1):
            raise VlccValueError(f"commit_every must be an int >= 1 or None, got {commit_every!r}")
        self.comm = comm
        self.guard = Guard(comm, timeout, abort_after)
        self.local = TieredStore(tiers, plan, **options)
        self.tiers = self.local.tiers
        self._shared = {k: t for k, t in enumerate(self.tiers) if isinstance(t, SharedZarrTier)}
        self.shared_levels = tuple(self._shared)
        for k, tier in self._shared.items():
            if tier.size != comm.Get_size():
                raise VlccValueError(
                    f"tiers[{k}] was opened on a communicator of "
                    f"{tier.size} ranks, this store's has {comm.Get_size()}"
                )
        self.commit_every = commit_every
        self._layouts = _Layouts(max_chunks_per_block)
        try:  # does this version's TieredStore.load take copy=?
            self._views = "copy" in inspect.signature(self.local.load).parameters
        except (TypeError, ValueError):  # pragma: no cover
            self._views = False
        self._moved = False
        self._since = 0
        self._finished = False
        self.committed: list[str] = []
        self.commit_seconds = 0.0
        self.layout_seconds = 0.0

    # -- the TieredStore calls ----------------------------------------------------

    def save(self, step: int, state: Any, level: int = 0) -> None:
        """``TieredStore.save`` of this rank's part of ``u_step``, after moving
        misaligned blocks to their storage layout (collective then)."""
        self.guard.check()
        t0 = time.perf_counter()
        state, moved = _move(self.guard, self._layouts, state, back=False)
        self._moved |= moved
        self.layout_seconds += time.perf_counter() - t0
        self.local.save(step, state, level)
        if self.commit_every is not None and level in self.shared_levels:
            self._since += 1
            if self._since >= self.commit_every:
                self.commit()

    def load(self, step: int, level: int | None = None, out: Any = None, copy: bool = True) -> Any:
        """``TieredStore.load``, moving blocks back to the solver's layout.

        ``copy=False`` (read-only views, for a caller that copies at once:
        the executor's ``on_load`` path) is passed on when this rank's store
        supports it; moved blocks are fresh arrays either way.
        """
        self.guard.check()
        kwargs = {} if copy or not self._views else {"copy": False}
        if not self._moved:
            return self.local.load(step, level, out=out, **kwargs)
        state = self.local.load(step, level, **kwargs)
        t0 = time.perf_counter()
        state, _ = _move(self.guard, self._layouts, state, back=True)
        self.layout_seconds += time.perf_counter() - t0
        return state

    def delete(self, step: int, level: int | None = None) -> None:
        self.local.delete(step, level)

    def move(self, step: int, src: int, dst: int) -> None:
        self.local.move(step, src, dst)

    def sync(self, action_index: int) -> None:
        self.local.sync(action_index)

    def wait(self) -> None:
        """Flush this rank's pending writes (not collective)."""
        self.local.wait()

    def stats(self) -> StoreStats:
        return self.local.stats()

    def steps(self, level: int) -> list[int]:
        return self.local.steps(level)

    def reserve(self, state: Any, count: int = 1) -> None:
        self.local.reserve(state, count)

    # -- collective ---------------------------------------------------------------

    def commit(self, final: bool = False) -> list[str]:
        """Flush every rank's writes and publish the records.  Collective.

        **Returns:** the names of the records committed now.  Raises the
        same :class:`~vlcc_adjoint.mpi.AgreedError` on every rank if any
        rank's writes failed.
        """
        t0 = time.perf_counter()
        error = None
        try:
            self.local.wait()
        except Exception as exc:
            error = exc
        self.guard.agree(error, "flushing checkpoint writes before a commit")
        names = []
        for tier in self._shared.values():
            names += tier.commit(self.guard, final=final)
        self._since = 0
        self.committed += names
        self.commit_seconds += time.perf_counter() - t0
        return names

    def finish(self, timeout: float | None = 600.0) -> None:
        """Commit (collective) and close this rank's store, keeping the guard
        open: a run that still reduces its results over the guard finishes
        its store first, then closes the guard itself.  Idempotent."""
        if self._finished:
            return
        self._finished = True
        try:
            self.commit(final=True)
        except BaseException:
            self.local.close(timeout)
            raise
        self.local.close(timeout)

    def close(self, timeout: float | None = 600.0, *, collective: bool = True) -> None:
        """Commit (collective), then close this rank's store.  Idempotent.

        With ``collective=False`` (after a failure, when the other ranks may
        not be here), only this rank's store is closed and nothing is
        committed.
        """
        if not collective or self.guard.failed:
            if not self._finished:
                self._finished = True
                self.local.close(timeout)
            return
        self.finish(timeout)
        self.guard.close()

    def __enter__(self) -> DistributedStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        self.guard.fail(exc)
        try:
            self.close(collective=False)
        except Exception as close_error:
            exc.add_note(f"closing the DistributedStore afterwards also failed: {close_error!r}")

    def __repr__(self) -> str:
        return (
            f"DistributedStore(rank={self.guard.rank}/{self.guard.size}, "
            f"shared levels={list(self.shared_levels)}, local={self.local!r})"
        )


def write_checkpoint(
    path: str | os.PathLike,
    state: Any,
    comm: Any,
    *,
    step: int | None = None,
    key: str | None = None,
    durable: bool = False,
    timeout: float | None = 600.0,
    max_chunks_per_block: int = 4,
) -> str:
    """Write `state` (this rank's part) as one committed record of the shared
    hierarchy at `path`.  Collective.

    The explicit checkpoint for restart and migration: every rank passes
    its own state (its :class:`~vlcc_adjoint.mpi.DistributedArray` blocks,
    and replicated values equal on all ranks); the record can then be read
    on any number of ranks with :func:`~vlcc_adjoint.mpi.read_checkpoint`,
    or with plain zarr.

    **Arguments:** `path`, `state`, `comm`; `step` (recorded, and the default
    key ``u<step>``); `key` (default ``"state"``); `durable` (fsync);
    `timeout`; `max_chunks_per_block` (the layout rule).

    **Returns:** the record's name (its directory under `path`).
    """
    from ..storage import make_record

    guard = Guard(comm, timeout)
    tier = None
    try:
        tier = SharedZarrTier(path, comm, durable=durable, timeout=timeout)
        moved, _ = _move(guard, _Layouts(max_chunks_per_block), state, back=False)
        leaves, spec = flatten(moved)
        if step is not None:
            spec["step"] = int(step)
        tier.put(key or (f"u{step}" if step is not None else "state"), make_record(spec, leaves))
        names = tier.commit(guard, final=True)
    except BaseException as exc:
        guard.fail(exc)
        raise
    finally:
        if tier is not None:
            tier.close()  # the hierarchy's writer lock
    guard.close()
    return names[0]
