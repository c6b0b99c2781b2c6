"""Perfect-foresight caching: Belady's MIN over a byte budget.

A checkpoint schedule is known before it runs, so the store knows, for every
record, the action index of its next read.  With that knowledge the best
replacement rule is Belady's (L. A. Belady, "A study of replacement
algorithms for a virtual-storage computer", IBM Systems Journal 5(2),
78-101, 1966): when room is needed, evict the entry whose next use lies
farthest in the future (or that is never used again).  Two consequences,
both used by :class:`~vlcc_adjoint.storage.TieredStore`:

* **Admission with bypass.**  A new entry needed at time ``t`` may evict only
  entries needed strictly after ``t``.  If it cannot fit that way it is not
  admitted (it is read straight from its tier when its turn comes): holding
  it would cost a miss on something needed sooner.  For unit-size entries
  this "MIN with bypass" miss count is optimal over every policy that may
  decline to cache (Belady 1966; Mattson, Gecsei, Slutz & Traiger, IBM Syst.
  J. 9(2), 1970); ``tests/storage/test_belady.py`` checks it against an exhaustive
  search on small random traces.
* **Prefetch stops at the first refusal.**  The prefetcher walks the future
  reads in order and fetches each one that can be admitted; the first read
  that cannot be admitted stops the walk, because everything after it is
  needed later still and would be refused too (or would evict what the
  refused one needs).

With records of different sizes, exact optimality is NP-hard (it contains
knapsack); farthest-next-use-first remains the standard heuristic and, here,
the byte budget is never exceeded (a ``size > capacity`` entry is simply
never admitted).

Costs: the cache holds few entries (one per record that fits in RAM), so
victim selection sorts the evictable entries, ``O(k log k)`` for ``k``
entries; updates are ``O(1)`` dict operations.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable, Sequence

from ..errors import VlccKeyError, VlccValueError

__all__ = ["NEVER", "ForesightCache", "belady_misses", "next_use_times", "prefetch_order"]

#: The next-use time of an entry that is never read again.
NEVER = sys.maxsize


class ForesightCache:
    """A byte-bounded set of entries, each with a known next-use time.

    The cache only keeps the books (sizes, next uses, pins); the data lives
    with the caller.  ``used_bytes <= capacity_bytes`` always holds:
    :meth:`insert` refuses anything that does not fit.

    **Arguments:**

    - `capacity_bytes`: the budget (>= 0).
    """

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise VlccValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.peak_bytes = 0
        self._size: dict[Hashable, int] = {}
        self._next: dict[Hashable, int] = {}
        self._pins: dict[Hashable, int] = {}

    def __contains__(self, key) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    def __iter__(self):
        return iter(list(self._size))

    def size(self, key) -> int:
        """Bytes reserved for `key`."""
        return self._size[key]

    def next_use(self, key) -> int:
        """The next-use time of `key` (:data:`NEVER` if it is not read again)."""
        return self._next[key]

    def free_bytes(self) -> int:
        """Budget left."""
        return self.capacity_bytes - self.used_bytes

    def fits(self, size: int) -> bool:
        """Whether `size` bytes fit without evicting anything."""
        return self.used_bytes + size <= self.capacity_bytes

    def insert(self, key, size: int, next_use: int) -> None:
        """Reserve `size` bytes for `key` (which must be new and must fit)."""
        if key in self._size:
            raise VlccKeyError(f"{key!r} is already cached")
        if size < 0 or self.used_bytes + size > self.capacity_bytes:
            raise VlccValueError(
                f"{key!r} ({size} B) does not fit: {self.used_bytes} of "
                f"{self.capacity_bytes} B used; evict first (see victims_for)"
            )
        self._size[key] = int(size)
        self._next[key] = int(next_use)
        self.used_bytes += int(size)
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def update(self, key, next_use: int) -> None:
        """Set the next-use time of `key` (after it was read)."""
        self._next[key] = int(next_use)

    def remove(self, key) -> int:
        """Forget `key`; returns the bytes it held."""
        size = self._size.pop(key)
        del self._next[key]
        self._pins.pop(key, None)
        self.used_bytes -= size
        return size

    def pin(self, key) -> None:
        """Protect `key` from eviction (a reader is using it, or it is in flight)."""
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key) -> None:
        """Undo one :meth:`pin`."""
        n = self._pins.get(key, 0) - 1
        if n > 0:
            self._pins[key] = n
        else:
            self._pins.pop(key, None)

    def pinned(self, key) -> bool:
        return key in self._pins

    def victims_for(self, size: int, next_use: int) -> list | None:
        """The entries to evict so that `size` bytes needed at `next_use` fit.

        Belady's rule: evict the unpinned entries with the farthest next use
        first, and only those needed strictly after `next_use` (evicting one
        needed sooner or at the same time can never pay).  Returns the list
        of victims (empty if it already fits), or ``None`` if the entry
        should not be admitted.
        """
        if size > self.capacity_bytes:
            return None
        need = self.used_bytes + size - self.capacity_bytes
        if need <= 0:
            return []
        candidates = sorted(
            (k for k, t in self._next.items() if t > next_use and k not in self._pins),
            key=lambda k: self._next[k],
            reverse=True,
        )
        victims = []
        for k in candidates:
            victims.append(k)
            need -= self._size[k]
            if need <= 0:
                return victims
        return None


def next_use_times(trace: Sequence[Hashable]) -> list[int]:
    """For each position of `trace`, the position of the next access to the
    same key, or :data:`NEVER` (one backward pass)."""
    out = [NEVER] * len(trace)
    last: dict = {}
    for i in range(len(trace) - 1, -1, -1):
        out[i] = last.get(trace[i], NEVER)
        last[trace[i]] = i
    return out


def belady_misses(
    trace: Sequence[Hashable], capacity_bytes: int, sizes: dict | None = None
) -> tuple[int, int]:
    """Replay `trace` through a :class:`ForesightCache` (MIN with bypass).

    On every access: a hit updates the entry's next use (an entry never used
    again is dropped at once); a miss fetches the key and admits it if
    :meth:`ForesightCache.victims_for` allows.

    **Arguments:**

    - `trace`: the keys in access order.
    - `capacity_bytes`: the budget.
    - `sizes`: bytes per key (default 1 each).

    **Returns:** ``(misses, peak bytes held)``.
    """
    nxt = next_use_times(trace)
    cache = ForesightCache(capacity_bytes)
    misses = 0
    for i, key in enumerate(trace):
        size = 1 if sizes is None else sizes[key]
        if key in cache:
            if nxt[i] == NEVER:
                cache.remove(key)
            else:
                cache.update(key, nxt[i])
            continue
        misses += 1
        if nxt[i] == NEVER:
            continue
        victims = cache.victims_for(size, nxt[i])
        if victims is None:
            continue
        for v in victims:
            cache.remove(v)
        cache.insert(key, size, nxt[i])
    return misses, cache.peak_bytes


def prefetch_order(
    upcoming: Iterable[tuple[Hashable, int, int]], cache: ForesightCache, limit: int | None = None
) -> list[tuple[Hashable, list]]:
    """Decide which upcoming reads to prefetch, and what each one evicts.

    Walks `upcoming` (``(key, size, next_use)`` in increasing ``next_use``;
    keys already cached are skipped), and reserves room in `cache` for each
    read that Belady admits, evicting the victims from `cache`'s books.  The
    walk stops at the first refusal (everything later would be refused too)
    or after `limit` fetches.

    **Returns:** ``[(key, victims), ...]`` in fetch order; the caller starts
    the reads and frees the victims' data.
    """
    decisions: list[tuple[Hashable, list]] = []
    for key, size, t in upcoming:
        if key in cache:
            continue
        if limit is not None and len(decisions) >= limit:
            break
        victims = cache.victims_for(size, t)
        if victims is None:
            break
        for v in victims:
            cache.remove(v)
        cache.insert(key, size, t)
        decisions.append((key, victims))
    return decisions
