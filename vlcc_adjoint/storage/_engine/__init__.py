"""The asynchronous checkpoint engine behind :class:`TieredStore`.

The executor maps every schedule action to one call: ``Save(i, k)`` ->
``save(i, state, k)``, ``Load(i, k)`` -> ``load(i, k)``, ``Delete(i, k)`` ->
``delete(i, k)``, ``Move(i, k, d)`` -> ``move(i, k, d)``.  Levels index the
``tiers`` list, 0 the fastest.  Behind those calls, one module per job:

- :mod:`._clock`: the plan clock.  The schedule's future I/O, rebuilt from
  its :func:`~vlcc_adjoint.schedules.io_plan`; every call is checked
  against the next planned action (:class:`PlanMismatchError`), and the
  position in that sequence orders prefetching and the job queue.
- :mod:`._capture`: a state becomes leaves the store owns: flattened,
  copied into pooled buffers with the checksum computed in the same pass,
  or kept by reference when a state provider vouches that they cannot
  change; optional deduplication by content digest.
- :mod:`._jobs`: one priority queue of background jobs (earliest need
  first), worker threads started with the first job, work stealing by
  blocked callers, and the record of failures raised on the next call.
- :mod:`._placement`: staging room for captures waiting for their write,
  and capacity reservations with ``policy="spill"`` to slower tiers.
- :mod:`._write`: the write path.  Memory levels (tiers that declare
  ``retains_references``) are written in the caller; slower levels on the
  workers; deletes and moves.
- :mod:`._cache`: the read-ahead cache, run by Belady's optimal
  replacement rule (Belady 1966) with the plan's knowledge of future reads.
- :mod:`._restore`: a record back into a state: into ``out=``, into new
  arrays, or as read-only views; memory records verified while copied.
- :mod:`._store`: :class:`TieredStore`, the facade that validates each
  call and hands it to the parts above.

The parts share one :class:`~._common.Shared` (tiers and their declared
capabilities, the lock, the index of records, the counters).  The public
methods are serialised by one re-entrant lock, so a store may be shared by
several threads (plan-following then needs their calls in schedule order).
A single-threaded store (``threadsafe=False``: no workers, calls from one
thread at a time) takes no lock at all.  Time accounting (stall, hidden
I/O) is defined in :mod:`.._stats`.

Buffers are owned explicitly (:mod:`.._pool`): a record's buffers return
to the pool when its last holder (its tier, a read-ahead slot, a move) lets
go of them, and the memory behind views lent to a caller is held by a
lease (``load(copy=False)``: until the record's deletion; ``lend``: until
released).  Nothing is judged free from reference counts.

References: L. A. Belady, "A study of replacement algorithms for a
virtual-storage computer", IBM Systems Journal 5(2):78-101, 1966 (eviction);
R. D. Blumofe and C. E. Leiserson, "Scheduling multithreaded computations
by work stealing", J. ACM 46(5):720-748, 1999 (callers helping workers);
Y. Collet, xxHash (XXH3), https://github.com/Cyan4973/xxHash (checksums and
content digests).
"""

from ._common import PlanMismatchError as PlanMismatchError
from ._restore import StateLease as StateLease
from ._store import TieredStore as TieredStore

__all__ = ["PlanMismatchError", "StateLease", "TieredStore"]
