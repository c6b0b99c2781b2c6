"""Offload of saved activations: autograd's saved tensors through a tiered store.

Autograd keeps, for the backward pass, the tensors each operation saved
(inputs of matmuls, outputs of activations, ...).  :class:`offload_saved_tensors`
is a ``torch.autograd.graph.saved_tensors_hooks`` context that routes them:

* tensors smaller than ``threshold_bytes``, parameters and views of
  parameters (they stay in memory anyway), and tensors this module cannot
  represent are left to autograd, untouched;
* the others are *kept* by reference, as autograd would keep them, while
  the kept bytes fit in the budget's ``keep`` share (level 0, zero copy);
* beyond it, they are copied to the host and written through a
  :class:`~vlcc_adjoint.storage.TieredStore` (default: one ``ZarrTier`` in
  a temporary directory; or your tiers, e.g. ``[CompressedMemoryTier(capacity_bytes=...),
  ZarrTier(path)]``, with ``policy="spill"`` from one to the next).  The
  write runs on the store's worker threads, behind the forward pass.

The plan.  The backward pass unpacks saved tensors in (nearly exactly) the
reverse of the order they were packed, so that reversed pack order *is* the
I/O plan, known as soon as the forward pass ends.  A ``TieredStore`` takes
its plan (an ``io_plan`` of a schedule) at construction, before the first
tensor is packed and before their number is known, so the store runs
without one and this module prefetches itself: one thread walks the
offloaded tensors from the last packed down, reading each into a prefetch
buffer of ``prefetch`` bytes ahead of the backward pass, starting when the
context exits (the forward pass is over) or at the first unpack.  An unpack
out of that order (a graph that is not a chain) reads synchronously and
moves the prefetch cursor below it.

The budget.  ``budget_bytes`` bounds the host bytes this context holds for
saved tensors at any moment: kept tensors + copies staged for the store's
background writes (and its pool of reusable staging buffers) + prefetched
copies.  It is split into ``keep`` (default 1/2), ``staging`` (1/4) and
``prefetch`` (1/4); each share is enforced on its own, so their sum never
exceeds the budget, with one exception: a single tensor larger than the
staging share is staged alone (``TieredStore`` accepts one oversized
capture when nothing else is staged); :meth:`stats` reports the peaks.
Not counted: what autograd holds while a backward node runs (the unpacked
tensors of that node), what the tiers hold (compressed memory, disk) and
small tensors left to autograd.

Lifetime.  A saved tensor's record is freed when autograd releases it
(after its node ran, without ``retain_graph``; or when the graph is
dropped), so a graph that is backpropagated twice (``retain_graph=True``)
reads its records twice.  The store lives as long as this object: call
:meth:`close` (or use it for many iterations and close at the end).

Exactness: tensors are stored bit-exactly (any dtype, via
:func:`~vlcc_adjoint.torch.tensor_to_numpy`) and dense permuted layouts
(transposes) come back with their original strides, so gradients are
identical to those without offload.  Tensors modified in place after they
were saved raise, as autograd's own check would.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import VlccRuntimeError, VlccValueError
from ._state import dtype_name, numpy_to_tensor, register_providers, tensor_to_numpy

if TYPE_CHECKING:
    from ..storage import Tier

__all__ = ["OffloadStats", "offload_saved_tensors"]


@dataclasses.dataclass(frozen=True)
class OffloadStats:
    """What an :class:`offload_saved_tensors` context did (cumulative).

    **Attributes:** `packed` (saved tensors routed by the context) and
    `packed_bytes`; `kept`/`kept_bytes` (held by reference);
    `offloaded`/`offloaded_bytes` (written to the store); `prefetched`
    (offloaded tensors read ahead), `prefetch_hits` (unpacks served from the
    prefetch buffer), `sync_reads` (unpacks that read the store
    synchronously) and `stall_seconds` (time unpacks waited);
    `peak_kept_bytes`, `peak_staging_bytes`, `peak_prefetch_bytes` and
    `peak_bytes` (their sum at its largest, as sampled at every pack,
    unpack and prefetch), against `budget_bytes` and its shares
    `keep_bytes`, `staging_bytes`, `prefetch_bytes`.
    """

    packed: int
    packed_bytes: int
    kept: int
    kept_bytes: int
    offloaded: int
    offloaded_bytes: int
    prefetched: int
    prefetch_hits: int
    sync_reads: int
    stall_seconds: float
    peak_kept_bytes: int
    peak_staging_bytes: int
    peak_prefetch_bytes: int
    peak_bytes: int
    budget_bytes: int
    keep_bytes: int
    staging_bytes: int
    prefetch_bytes: int


class _Rec:
    """One saved tensor routed by the context."""

    __slots__ = (
        "key",
        "nbytes",
        "tensor",
        "version",
        "dtype",
        "shape",
        "perm",
        "device",
        "refs",
        "state",
        "__weakref__",
    )

    def __init__(self, key, nbytes, dtype, shape, device):
        self.key = key
        self.nbytes = nbytes
        self.tensor = None  # kept by reference (level 0)
        self.version = 0
        self.dtype = dtype
        self.shape = shape
        self.perm = None  # the permutation that made a dense, permuted tensor contiguous
        self.device = device
        self.refs = 0  # live handles (one saved tensor may be saved by several nodes)
        self.state = "kept"  # kept | stored | gone


class _Handle:
    """What autograd holds instead of a routed tensor; its death frees the record."""

    __slots__ = ("rec", "owner", "__weakref__")

    def __init__(self, rec, owner):
        self.rec = rec
        self.owner = owner
        rec.refs += 1

    def __del__(self):
        owner, rec = self.owner, self.rec
        rec.refs -= 1
        if rec.refs == 0:
            if rec.state == "kept":
                rec.tensor = None  # the memory goes now; the byte count at the next call
            owner._dead.append(rec)


def _dense_permutation(t: torch.Tensor):
    """A permutation ``p`` with ``t.permute(p)`` contiguous, if `t` is a dense
    permuted layout (a transpose); ``None`` for contiguous or other layouts."""
    if t.is_contiguous() or t.dim() < 2:
        return None
    strides = t.stride()
    order = sorted(range(t.dim()), key=lambda d: (-strides[d], d))
    p = t.permute(order)
    return order if p.is_contiguous() else None


class offload_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """A context in which autograd's saved tensors go to a tiered store.

    ::

        off = offload_saved_tensors(budget_bytes=256 << 20)
        for batch in loader:
            with off:
                loss = model(batch)
            loss.backward()          # prefetched in reverse order
        off.close()

    **Arguments:**

    - `budget_bytes`: the most host bytes held for saved tensors (see the
      module docstring for what counts).
    - `tiers`: the storage levels below the budget, fastest first, as
      :class:`~vlcc_adjoint.storage.Tier` objects; default one ``ZarrTier``
      in a temporary directory (under `directory`), removed by :meth:`close`.
      Several tiers spill from one to the next when full.
    - `directory`: where the default temporary ``ZarrTier`` lives.
    - `threshold_bytes`: smaller saved tensors are left to autograd.
    - `keep_bytes`, `staging_bytes`, `prefetch_bytes`: the budget's shares
      (default 1/2, 1/4, 1/4; given ones are taken, the rest of the budget
      goes to `keep_bytes`).  They must sum to at most `budget_bytes`.
    - `workers`: the store's writer threads (default 1).
    """

    def __init__(
        self,
        budget_bytes: int,
        *,
        tiers: Sequence[Tier] | None = None,
        directory: str | os.PathLike | None = None,
        threshold_bytes: int = 1 << 20,
        keep_bytes: int | None = None,
        staging_bytes: int | None = None,
        prefetch_bytes: int | None = None,
        workers: int = 1,
    ):
        register_providers()
        for name, value in (("budget_bytes", budget_bytes), ("threshold_bytes", threshold_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VlccValueError(f"{name} must be an int >= 0, got {value!r}")
        staging = budget_bytes // 4 if staging_bytes is None else int(staging_bytes)
        prefetch = budget_bytes // 4 if prefetch_bytes is None else int(prefetch_bytes)
        keep = budget_bytes - staging - prefetch if keep_bytes is None else int(keep_bytes)
        if min(staging, prefetch, keep) < 0 or staging + prefetch + keep > budget_bytes:
            raise VlccValueError(
                f"keep_bytes={keep} + staging_bytes={staging} + "
                f"prefetch_bytes={prefetch} must be >= 0 and sum to at most "
                f"budget_bytes={budget_bytes}"
            )
        super().__init__(self._pack, self._unpack)
        self.budget_bytes = int(budget_bytes)
        self.keep_limit, self.staging_limit, self.prefetch_limit = keep, staging, prefetch
        self.threshold = int(threshold_bytes)
        self._tiers = tiers
        self._directory = directory
        self._workers = workers
        self._store = None
        self._tmpdir = None
        self._keys = itertools.count()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._dead: collections.deque = collections.deque()  # records whose handles died
        self._alias: dict[int, tuple] = {}  # id(tensor) -> (weakref(tensor), version, rec)
        self._stored: list[_Rec] = []  # offloaded records in pack order (the plan, reversed)
        self._cursor = None  # prefetch: the next position in _stored to consider (descending)
        self._buffer: dict[int, np.ndarray] = {}  # key -> prefetched array
        self._inflight: int | None = None  # key being prefetched
        self._prefetch_used = 0
        self._kept_used = 0
        self._thread = None
        self._stop = False
        self._closed = False
        self._error = None
        self._n: collections.Counter[str] = collections.Counter()
        self._peak = dict(kept=0, staging=0, prefetch=0, total=0)
        self._stall = 0.0

    # -- the store ---------------------------------------------------------------------

    def _ensure_store(self):
        if self._store is None:
            from ..storage import TieredStore, ZarrTier

            tiers = self._tiers
            if tiers is None:
                self._tmpdir = tempfile.mkdtemp(prefix="vlcc-offload-", dir=self._directory)
                tiers = [ZarrTier(os.path.join(self._tmpdir, "tensors"))]
            # No plan, no read cache (this module prefetches), and the pool of
            # reusable staging buffers shares the staging allowance.
            half = max(self.staging_limit // 2, 0)
            self._store = TieredStore(
                list(tiers),
                staging_bytes=half,
                pool_bytes=half,
                prefetch_bytes=0,
                workers=self._workers,
                policy="spill" if len(tiers) > 1 else "raise",
                close_tiers=self._tiers is None,
            )
            self._finalizer = weakref.finalize(self, _cleanup, self._store, self._tmpdir)
        return self._store

    # -- bookkeeping ---------------------------------------------------------------------

    def _reap(self):
        """Account for records whose handles died (caller holds the lock)."""
        while self._dead:
            rec = self._dead.popleft()
            if rec.refs > 0 or rec.state == "gone":
                continue
            if rec.state == "kept":
                self._kept_used -= rec.nbytes
            else:
                arr = self._buffer.pop(rec.key, None)
                if arr is not None:
                    self._prefetch_used -= arr.nbytes
                self._store.delete(rec.key, 0)
            rec.state = "gone"
            rec.tensor = None
        self._cond.notify_all()

    def _sample(self):
        staging = 0
        if self._store is not None:
            s = self._store.stats()
            staging = s.staging_bytes
            self._peak["staging"] = max(self._peak["staging"], s.peak_staging_bytes)
        self._peak["kept"] = max(self._peak["kept"], self._kept_used)
        self._peak["prefetch"] = max(self._peak["prefetch"], self._prefetch_used)
        self._peak["total"] = max(
            self._peak["total"], self._kept_used + staging + self._prefetch_used
        )

    def _raise_error(self):
        if self._error is not None:
            err, self._error = self._error, None
            raise VlccRuntimeError(
                f"offload_saved_tensors: the prefetch thread failed: {err!r}"
            ) from err

    # -- hooks -------------------------------------------------------------------------

    def _eligible(self, t) -> bool:
        if (
            type(t) is not torch.Tensor
            or t.layout != torch.strided
            or t.is_quantized
            or t.is_nested
            or t.device.type == "meta"
            or dtype_name(t.dtype) is None
        ):
            return False
        if t.numel() * t.element_size() < self.threshold:
            return False
        if t.requires_grad and t.is_leaf:  # a parameter: in memory anyway
            return False
        base = t._base
        if base is not None and base.is_leaf and base.requires_grad:  # a view of one
            return False
        return True

    def _pack(self, t):
        if self._closed:
            raise VlccRuntimeError(
                "offload_saved_tensors: this context was closed; create a new one"
            )
        if not self._eligible(t):
            return t
        nbytes = t.numel() * t.element_size()
        with self._lock:
            self._reap()
            seen = self._alias.get(id(t))
            if (
                seen is not None
                and seen[0]() is t
                and seen[1] == t._version
                and seen[2].state != "gone"
            ):
                return _Handle(seen[2], self)
            rec = _Rec(next(self._keys), nbytes, t.dtype, tuple(t.shape), t.device)
            self._n["packed"] += 1
            self._n["packed_bytes"] += nbytes
            if self._kept_used + nbytes <= self.keep_limit:
                rec.tensor, rec.version = t, t._version
                self._kept_used += nbytes
                self._n["kept"] += 1
                self._n["kept_bytes"] += nbytes
            else:
                rec.state = "stored"
                rec.perm = _dense_permutation(t)
                src = t if rec.perm is None else t.permute(rec.perm)
                store = self._ensure_store()
                store.save(rec.key, tensor_to_numpy(src), 0)
                self._stored.append(rec)
                self._n["offloaded"] += 1
                self._n["offloaded_bytes"] += nbytes
            self._alias[id(t)] = (weakref.ref(t), t._version, rec)
            if len(self._alias) > 4096:
                self._alias = {k: v for k, v in self._alias.items() if v[0]() is not None}
            self._sample()
            return _Handle(rec, self)

    def _unpack(self, h):
        if not isinstance(h, _Handle):
            return h
        rec = h.rec
        if rec.state == "kept":
            t = rec.tensor
            if t._version != rec.version:
                raise VlccRuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: a saved tensor of shape {list(rec.shape)} is at "
                    f"version {t._version}, expected version {rec.version} (saved under "
                    "offload_saved_tensors)"
                )
            return t
        t0 = time.perf_counter()
        with self._lock:
            self._raise_error()
            self._reap()
            self._begin_backward()
            while self._inflight == rec.key:
                self._cond.wait(0.05)
            # Other live handles of this record (a tensor saved by several nodes)
            # will unpack it too: the buffer keeps it until the last one.
            shared = rec.refs > 1
            arr = self._buffer.get(rec.key)
            if arr is not None:
                self._n["prefetch_hits"] += 1
                if not shared:
                    del self._buffer[rec.key]
                    self._prefetch_used -= arr.nbytes
            # The prefetcher continues below this record.
            pos = self._position(rec.key)
            if pos is not None:
                self._cursor = pos - 1 if self._cursor is None else min(self._cursor, pos - 1)
            self._cond.notify_all()
        if arr is None:
            arr = self._store.load(rec.key, 0)
            with self._lock:
                self._n["sync_reads"] += 1
                if (
                    shared
                    and rec.key not in self._buffer
                    and self._prefetch_used + arr.nbytes <= self.prefetch_limit
                ):
                    self._buffer[rec.key] = arr
                    self._prefetch_used += arr.nbytes
        self._stall += time.perf_counter() - t0
        t = numpy_to_tensor(arr, rec.dtype)
        if rec.perm is not None:
            inverse = [0] * len(rec.perm)
            for i, d in enumerate(rec.perm):
                inverse[d] = i
            t = t.reshape([rec.shape[d] for d in rec.perm]).permute(inverse)
        else:
            t = t.reshape(rec.shape)
        if rec.device.type != "cpu":
            t = t.to(rec.device, non_blocking=False)
        with self._lock:
            self._sample()
        return t

    # -- prefetch ----------------------------------------------------------------------

    def _position(self, key):
        """Index of the record `key` in ``_stored`` (keys increase along it)."""
        lo, hi = 0, len(self._stored)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._stored[mid].key < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self._stored) and self._stored[lo].key == key:
            return lo
        return None

    def _begin_backward(self):
        """Start the prefetcher (caller holds the lock)."""
        if self._stored and self._cursor is None:
            self._cursor = len(self._stored) - 1
        if self._thread is None and self._stored and self.prefetch_limit > 0:
            self._thread = threading.Thread(
                target=self._prefetch_loop, name="vlcc-offload-prefetch", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()

    def _next_candidate(self):
        """The next record to prefetch and whether it fits now (caller holds the lock)."""
        while self._cursor is not None and self._cursor >= 0:
            rec = self._stored[self._cursor]
            if rec.state != "stored" or rec.key in self._buffer:
                self._cursor -= 1
                continue
            return rec
        return None

    def _prefetch_loop(self):
        try:
            while True:
                with self._lock:
                    while True:
                        if self._stop:
                            return
                        self._reap()
                        rec = self._next_candidate()
                        if (
                            rec is not None
                            and self._prefetch_used + rec.nbytes <= self.prefetch_limit
                        ):
                            break
                        self._cond.wait(0.05)
                    self._inflight = rec.key
                    self._cursor -= 1
                    self._prefetch_used += rec.nbytes  # reserved while it is read
                arr = None
                try:
                    arr = self._store.load(rec.key, 0)
                finally:
                    with self._lock:
                        self._inflight = None
                        if arr is not None and rec.state == "stored" and rec.refs > 0:
                            self._buffer[rec.key] = arr
                            self._n["prefetched"] += 1
                            self._sample()
                        else:
                            self._prefetch_used -= rec.nbytes
                        self._cond.notify_all()
        except BaseException as err:  # reported by the next unpack
            with self._lock:
                self._error = err
                self._cond.notify_all()

    # -- context -----------------------------------------------------------------------

    def __enter__(self):
        if self._closed:
            raise VlccRuntimeError(
                "offload_saved_tensors: this context was closed; create a new one"
            )
        with self._lock:
            if self._store is not None:
                self._reap()
            # A new forward pass: records of earlier passes stay (their graphs may
            # still be backpropagated), the plan restarts after them.
            self._stored = [r for r in self._stored if r.state == "stored"]
            self._cursor = None
        super().__enter__()
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        with self._lock:
            if self._store is not None:
                self._begin_backward()  # the forward pass is over: read ahead now
        return False

    def stats(self) -> OffloadStats:
        """Counters and peaks so far (:class:`OffloadStats`)."""
        with self._lock:
            if self._store is not None:
                self._reap()
            self._sample()
            n = self._n
            return OffloadStats(
                packed=n["packed"],
                packed_bytes=n["packed_bytes"],
                kept=n["kept"],
                kept_bytes=n["kept_bytes"],
                offloaded=n["offloaded"],
                offloaded_bytes=n["offloaded_bytes"],
                prefetched=n["prefetched"],
                prefetch_hits=n["prefetch_hits"],
                sync_reads=n["sync_reads"],
                stall_seconds=self._stall,
                peak_kept_bytes=self._peak["kept"],
                peak_staging_bytes=self._peak["staging"],
                peak_prefetch_bytes=self._peak["prefetch"],
                peak_bytes=self._peak["total"],
                budget_bytes=self.budget_bytes,
                keep_bytes=self.keep_limit,
                staging_bytes=self.staging_limit,
                prefetch_bytes=self.prefetch_limit,
            )

    def close(self) -> None:
        """Stop the prefetcher, close the store, remove the temporary directory.

        Graphs recorded under this context can no longer be backpropagated."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._store is not None:
            self._finalizer()


def _cleanup(store, tmpdir):
    try:
        store.close()
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
