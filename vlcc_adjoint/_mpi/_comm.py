"""Collectives that cannot hang: timeouts, an error channel, and agreement.

The failure mode of SPMD codes
------------------------------

Every rank of an SPMD run waits for the others somewhere (a halo exchange,
a reduction, a checkpoint commit).  When one rank raises, the others keep
waiting for a message that will never come, and the job hangs until the
batch system kills it.  MPI itself offers no portable way out: blocking
calls have no timeout, and ULFM (``MPI_Comm_revoke``) is not in the
standard or in the ``mpich`` wheels.  The :class:`Guard` builds the missing
piece from standard MPI-3 parts:

* **Non-blocking collectives polled against a deadline.**  Every wait of
  this package (``Ibarrier``, ``Iallreduce``, ``Igatherv``, halo
  ``Isend``/``Irecv``) polls ``Testall`` with a back-off: it spins for
  100 us, then yields the core, then sleeps (so that oversubscribed ranks
  leave the cores to the ranks that compute), and raises
  :class:`CollectiveTimeoutError` at the deadline; it probes the error
  channel every 32 polls, and at every poll after 1 ms.  Spinning first
  keeps a halo exchange, whose message is usually there within the spin,
  as fast as a bare ``MPI.Request.Waitall``; yielding and sleeping next
  leave oversubscribed cores to the ranks that compute.
* **An error channel.**  At creation the guard duplicates the
  communicator (``Idup``, itself polled); on the duplicate a reserved tag
  carries errors.  A rank that fails sends its error (type and message, as
  JSON) to every other rank; every poll loop also probes for it
  (``Iprobe`` from ``MPI_ANY_SOURCE``: nothing pre-posted, nothing to
  cancel), so a waiting rank raises :class:`RankFailedError`
  naming the failed rank and its error, within one poll interval.  Ranks
  busy computing see it at their next check (the SPMD executor checks
  before every solver call).
* **Acknowledgement, then abort.**  The failed rank waits up to
  `abort_after` seconds for every other rank to acknowledge the error (a
  rank acknowledges when it raises :class:`RankFailedError`).  If some rank
  does not (it is stuck in a blocking call of user code, or looping), the
  failed rank calls ``MPI_Abort`` on ``COMM_WORLD``: the launcher then ends
  every process.  Either way every rank exits with the error within a bounded
  time, never a hang.
* **Agreement.**  Outcomes that every rank must share (a checkpoint commit,
  the schedule check) are decided by a reduction of per-rank status flags;
  a failure on one rank becomes the same :class:`AgreedError` on every rank,
  with the first failed rank's message broadcast to all.

The guard that a run uses is registered as the *active* guard of its
communicator (:func:`active_guard`), so that code running inside the run
(:class:`~vlcc_adjoint.mpi.HaloExchange` in a solver) waits through it and
sees remote failures too.

Reference: Bland et al., "Post-failure recovery of MPI communication
capability: design and rationale" (ULFM), IJHPCA 27(3), 2013, for the
problem; the mechanism here is the portable subset.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..errors import VlccError, VlccImportError, VlccRuntimeError, VlccValueError

__all__ = [
    "AgreedError",
    "CollectiveTimeoutError",
    "Guard",
    "RankFailedError",
    "active_guard",
    "ensure_initialized",
    "gather_blocks",
    "mpi_module",
    "poll",
    "redistribute",
    "split_by_node",
]

_ERR, _ACK, _P2P = 11, 12, 13
_MSG = 8192  # bytes of an error message on the channel

_ACTIVE: dict[int, Guard] = {}
_ACTIVE_LOCK = threading.Lock()


_STARTED = False  # MPI found (or made) initialised once in this process


def mpi_module() -> Any:
    """``mpi4py.MPI``, with MPI initialised (see :func:`ensure_initialized`):
    the one place this package imports mpi4py."""
    try:
        from mpi4py import MPI
    except ImportError as err:  # pragma: no cover - exercised without mpi4py
        raise VlccImportError(
            "vlcc_adjoint.mpi needs mpi4py and an MPI library: pip install 'vlcc-adjoint[mpi]' "
            "(mpi4py + the mpich wheel), or mpi4py built against your cluster's MPI"
        ) from err
    if not _STARTED:
        ensure_initialized(MPI)
    return MPI


def ensure_initialized(MPI: Any = None) -> None:
    """Initialise MPI if a library imported before us deferred it.

    ``from mpi4py import MPI`` initialises MPI, unless a library imported
    first set ``mpi4py.rc(initialize=False)`` to do it later itself (Devito
    does, and initialises MPI only in its own MPI mode).  Any MPI call then
    ends the process (MPICH: "Attempting to use an MPI routine before
    initializing"), with exit status 1 and no Python traceback.  So every
    class of this package that takes a communicator calls this first, and so
    should a solver that calls its communicator before it hands it to one of
    them (``comm.Get_rank()`` in a constructor: the distributed seismic
    example does).  MPI is initialised as mpi4py would have done
    (``MPI_Init_thread`` at ``mpi4py.rc.thread_level``) and finalised at
    exit, since this process started it (whoever initialised MPI finalises
    it; Devito's exit handler finalises only what Devito initialised).
    Cheap after the first call.

    **Arguments:**

    - `MPI`: the ``mpi4py.MPI`` module, if the caller has it in hand
      (default: imported here).

    Raises :class:`~vlcc_adjoint.errors.VlccRuntimeError` (a
    ``RuntimeError``) if MPI was finalised already.
    """
    global _STARTED
    if MPI is None:
        MPI = mpi_module()
    with _ACTIVE_LOCK:
        if _STARTED:
            return
        if MPI.Is_finalized():
            raise VlccRuntimeError(
                "MPI is finalized already in this process; vlcc_adjoint.mpi needs "
                "it running (finalize MPI only at the end of the program)"
            )
        if not MPI.Is_initialized():
            import atexit

            import mpi4py

            levels = {
                "single": MPI.THREAD_SINGLE,
                "funneled": MPI.THREAD_FUNNELED,
                "serialized": MPI.THREAD_SERIALIZED,
                "multiple": MPI.THREAD_MULTIPLE,
            }
            MPI.Init_thread(levels.get(str(mpi4py.rc.thread_level), MPI.THREAD_MULTIPLE))
            atexit.register(_finalize, MPI)
        _STARTED = True


def _finalize(MPI) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


class CollectiveTimeoutError(VlccError, TimeoutError):
    """A rank waited longer than the guard's timeout for the others."""


class RankFailedError(VlccError, RuntimeError):
    """Another rank failed; raised on every rank that was waiting for it.

    **Attributes:** `rank` (the failed rank), `error_type` and `error_message`
    (its exception's type name and text).
    """

    def __init__(self, rank: int, error_type: str, error_message: str, here: int):
        super().__init__(
            f"rank {rank} failed with {error_type}: {error_message} "
            f"(seen by rank {here}; every rank stops)"
        )
        self.rank = rank
        self.error_type = error_type
        self.error_message = error_message


class AgreedError(VlccError, RuntimeError):
    """An error all ranks agreed on (raised identically on every rank).

    **Attributes:** `rank`: the first rank that failed (``None`` when the
    ranks disagreed rather than failed).
    """

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def active_guard(comm: Any) -> Guard | None:
    """The guard of the SPMD run now using `comm` (``None`` outside a run)."""
    try:
        key = comm.py2f()
    except Exception:
        return None
    return _ACTIVE.get(key)


def _backoff(waited: float) -> None:
    """Pause between two polls, by how long the wait has lasted: spin for the
    first 100 us (a halo message is usually there by then), then yield the
    core (``sched_yield``: an oversubscribed neighbour may need it), and after
    5 ms sleep, up to 1 ms at a time."""
    if waited < 1e-4:
        return
    if waited < 5e-3:
        time.sleep(0)
    else:
        time.sleep(min(1e-3, waited / 50))


def poll(requests, what: str, timeout: float | None) -> None:
    """Wait for `requests` with a deadline, without a guard (no error channel)."""
    MPI = mpi_module()
    t0 = time.perf_counter()
    while not MPI.Request.Testall(requests):
        waited = time.perf_counter() - t0
        if timeout is not None and waited > timeout:
            raise CollectiveTimeoutError(
                f"waited {timeout} s for the other ranks while {what}; a rank is missing, hung or "
                "much slower (check that every rank makes the same calls, or raise the timeout)"
            )
        _backoff(waited)


class Guard:
    """Timeouts, an error channel and agreement on one communicator.

    **Arguments:**

    - `comm`: an mpi4py intra-communicator; the guard works on a duplicate.
      Creating a guard is collective over `comm`.
    - `timeout`: the most seconds any wait may last before
      :class:`CollectiveTimeoutError` (``None``: no limit; then only the
      error channel ends waits).
    - `abort_after`: after a local failure, the most seconds to wait for
      the other ranks to acknowledge it before ``MPI_Abort`` (default:
      ``min(timeout, 60)``).

    See the module docstring for the protocol.
    """

    def __init__(self, comm: Any, timeout: float | None = 600.0, abort_after: float | None = None):
        MPI = mpi_module()
        if timeout is not None and not timeout > 0:
            raise VlccValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.abort_after = (
            (min(timeout, 60.0) if timeout is not None else 60.0)
            if abort_after is None
            else float(abort_after)
        )
        self.parent = comm
        dup, req = comm.Idup()
        poll([req], "creating the run's communicator (every rank must create it)", timeout)
        self.comm = dup
        self.rank = dup.Get_rank()
        self.size = dup.Get_size()
        self.failed = False
        self.remote: RankFailedError | None = None
        self.wait_seconds = 0.0
        self._closed = False
        self._status = MPI.Status()
        self._seen: set[int] = set()  # ranks whose error this rank has received

    # -- waiting ------------------------------------------------------------------

    def _take(self, tag: int) -> tuple[int, bytes] | None:
        """A message with `tag` from any rank, if one has arrived: ``(source, data)``.

        ``Iprobe`` then ``Recv``: nothing is pre-posted, so nothing needs
        cancelling when the run ends.
        """
        MPI = mpi_module()
        if self._closed or not self.comm.Iprobe(
            source=MPI.ANY_SOURCE, tag=tag, status=self._status
        ):
            return None
        src = self._status.Get_source()
        buf = bytearray(max(1, self._status.Get_count(MPI.BYTE)))
        self.comm.Recv([buf, MPI.BYTE], source=src, tag=tag)
        return src, bytes(buf)

    def _take_error(self) -> RankFailedError | None:
        """A remote error that arrived, if any."""
        got = self._take(_ERR)
        if got is None:
            return None
        src, data = got
        try:
            doc = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            doc = {"type": "error", "message": "(unreadable message)"}
        self._seen.add(src)
        return RankFailedError(src, str(doc.get("type")), str(doc.get("message")), self.rank)

    def check(self) -> None:
        """Raise :class:`RankFailedError` if another rank has reported a failure."""
        if self.remote is not None:
            raise self.remote
        err = self._take_error()
        if err is not None:
            self.remote = err
            raise err

    def wait(self, requests: Sequence[Any], what: str, timeout: float | None = None) -> None:
        """Complete `requests` (MPI requests), watching the error channel.

        Raises :class:`RankFailedError` when another rank fails meanwhile,
        :class:`CollectiveTimeoutError` after `timeout` (default: the
        guard's) seconds.
        """
        MPI = mpi_module()
        requests = list(requests)
        if not requests:
            return
        t0 = time.perf_counter()
        limit = self.timeout if timeout is None else timeout
        k = 0
        try:
            while not MPI.Request.Testall(requests):
                waited = time.perf_counter() - t0
                k += 1
                if k % 32 == 0 or waited > 1e-3:  # the error channel: an Iprobe
                    self.check()
                if limit is not None and waited > limit:
                    raise CollectiveTimeoutError(
                        f"rank {self.rank} waited {limit} s for the other ranks while {what}; a "
                        "rank is missing, hung or much slower (check that every rank makes the "
                        "same calls, or raise the timeout)"
                    )
                _backoff(waited)
        finally:
            self.wait_seconds += time.perf_counter() - t0

    # -- collectives ----------------------------------------------------------------

    def barrier(self, what: str) -> None:
        self.wait([self.comm.Ibarrier()], what)

    def allreduce(self, values: ArrayLike, op: str, what: str) -> np.ndarray:
        """Element-wise ``min``, ``max`` or ``sum`` of `values` over ranks."""
        MPI = mpi_module()
        send = np.ascontiguousarray(values)
        recv = np.empty_like(send)
        mpi_op = {"min": MPI.MIN, "max": MPI.MAX, "sum": MPI.SUM}[op]
        self.wait([self.comm.Iallreduce(send, recv, op=mpi_op)], what)
        return recv

    def allgather(self, values: ArrayLike, what: str) -> np.ndarray:
        """``(size, len(values))``: every rank's `values`."""
        send = np.ascontiguousarray(values)
        recv = np.empty((self.size,) + send.shape, send.dtype)
        self.wait([self.comm.Iallgather(send, recv)], what)
        return recv

    def gatherv(self, values: np.ndarray, root: int, what: str) -> list[np.ndarray] | None:
        """Every rank's 1-d `values` (any lengths) on `root`, as a list; ``None`` elsewhere."""
        MPI = mpi_module()
        send = np.ascontiguousarray(values).reshape(-1)
        counts = self.allgather(np.array([send.size], np.int64), what).reshape(-1)
        if self.rank == root:
            recv = np.empty(int(counts.sum()), send.dtype)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            spec = [recv, (counts * send.itemsize, displs * send.itemsize), MPI.BYTE]
        else:
            spec = None
        self.wait([self.comm.Igatherv([send, MPI.BYTE], spec, root=root)], what)
        if self.rank != root:
            return None
        return [recv[d : d + c] for d, c in zip(displs.tolist(), counts.tolist())]

    def bcast_text(self, text: str | None, root: int, what: str) -> str:
        """`text` of rank `root`, on every rank (at most 8 KiB kept)."""
        buf = bytearray(_MSG)
        if self.rank == root:
            data = (text or "").encode("utf-8", "replace")[: _MSG - 1]
            buf[: len(data)] = data
        self.wait([self.comm.Ibcast(buf, root=root)], what)
        return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace")

    def agree(self, error: BaseException | None, what: str) -> None:
        """Collective: raise the same :class:`AgreedError` on every rank if
        any rank passes an `error` (the lowest such rank's message wins)."""
        flags = np.array([self.size if error is None else self.rank], np.int64)
        first = int(self.allreduce(flags, "min", what)[0])
        if first == self.size:
            return
        message = None
        if self.rank == first:
            message = f"{type(error).__name__}: {error}"
        text = self.bcast_text(message, first, what)
        raise AgreedError(f"rank {first} failed while {what}: {text}", rank=first)

    # -- failure --------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Report `error` of this rank to the others (see the module docstring).

        For a :class:`RankFailedError` this acknowledges the remote failure;
        for an :class:`AgreedError` (every rank knows) it does nothing; for
        any other error it sends the error to every rank and waits up to
        `abort_after` seconds for their acknowledgements, then calls
        ``MPI_Abort`` if some rank did not answer.
        """
        MPI = mpi_module()
        if self.failed or self._closed:
            return
        self.failed = True
        if isinstance(error, AgreedError):
            return
        if isinstance(error, RankFailedError):
            self._ack(self._seen | {error.rank})
            # Other ranks may have failed at the same time: acknowledge them too.
            end = time.perf_counter() + 0.05
            while time.perf_counter() < end:
                err = self._take_error()
                if err is not None:
                    self._ack({err.rank})
                time.sleep(0.002)
            return
        doc = {"type": type(error).__name__, "message": _message(error)}
        data = json.dumps(doc).encode("utf-8")
        if len(data) > _MSG:
            doc["message"] = doc["message"][: _MSG // 2] + " ..."
            data = json.dumps(doc).encode("utf-8")[:_MSG]
        others = [r for r in range(self.size) if r != self.rank]
        sends = [self.comm.Isend([data, MPI.BYTE], dest=r, tag=_ERR) for r in others]
        waiting = set(others)
        t0 = time.perf_counter()
        while waiting and time.perf_counter() - t0 < self.abort_after:
            got = self._take(_ACK)
            if got is not None:
                waiting.discard(got[0])
                continue
            err = self._take_error()
            if err is not None:  # a rank that failed too counts as having seen ours
                waiting.discard(err.rank)
                self._ack({err.rank})
                continue
            _backoff(time.perf_counter() - t0)
        if waiting:
            sys.stderr.write(
                f"vlcc_adjoint.mpi: rank {self.rank} failed with {doc['type']}: "
                f"{doc['message']}\nranks {sorted(waiting)} did not acknowledge within "
                f"{self.abort_after} s (stuck in a blocking call?); calling MPI_Abort\n"
            )
            sys.stderr.flush()
            time.sleep(0.2)  # let the launcher forward the message before the teardown
            MPI.COMM_WORLD.Abort(1)
        poll(sends, "reporting the failure", 5.0)

    def _ack(self, ranks) -> None:
        MPI = mpi_module()
        reqs = [
            self.comm.Isend([b"\1", MPI.BYTE], dest=r, tag=_ACK)
            for r in sorted(ranks)
            if r != self.rank
        ]
        try:
            poll(reqs, "acknowledging a remote failure", 5.0)
        except CollectiveTimeoutError:  # the failed rank may have aborted already
            pass

    # -- lifetime ---------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self) -> Iterator[Guard]:
        """Make this the guard of its communicator while the block runs."""
        key = self.parent.py2f()
        with _ACTIVE_LOCK:
            previous = _ACTIVE.get(key)
            _ACTIVE[key] = self
        try:
            yield self
        finally:
            with _ACTIVE_LOCK:
                if previous is None:
                    _ACTIVE.pop(key, None)
                else:
                    _ACTIVE[key] = previous

    def close(self) -> None:
        """Cancel the error channel and free the communicator (after a
        successful run; after a failure the communicator is left alone,
        since freeing it is collective)."""
        if self._closed:
            return
        self._closed = True
        if self.failed:
            return
        self.comm.Free()

    def __repr__(self) -> str:
        return f"Guard(rank={self.rank}, size={self.size}, timeout={self.timeout})"


def _message(error: BaseException) -> str:
    text = str(error)
    notes = getattr(error, "__notes__", None)
    if notes:
        text += " [" + "; ".join(str(n) for n in notes) + "]"
    if not text:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return text


# ---------------------------------------------------------------------------
# moving blocks between decompositions
# ---------------------------------------------------------------------------


def split_by_node(comm: Any) -> Any:
    """A new communicator of the ranks of `comm` that share this rank's node
    (``comm.Split_type(MPI.COMM_TYPE_SHARED)``: the ranks that can share
    memory, and so a node-local RAM disk); rank 0 of it is the node's leader.
    Collective over `comm`; the caller frees the result."""
    MPI = mpi_module()
    return comm.Split_type(MPI.COMM_TYPE_SHARED)


def box_intersection(
    a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]
) -> tuple[tuple[int, int], ...] | None:
    """The box two boxes share (per axis ``(lo, hi)``, half-open), or
    ``None`` if they share no element.  Boxes of 0-d arrays share ``()``."""
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return box if all(hi > lo for lo, hi in box) else None


def _rel(box, origin) -> tuple[slice, ...]:
    return tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(box, origin))


def redistribute(guard: Guard, arrays, src, dst) -> list[np.ndarray]:
    """Move this rank's blocks of `arrays` (in decomposition `src`) to its
    blocks in `dst`: each rank sends the parts of its block that other ranks
    own in `dst` and receives the parts it owns from them.  Collective.

    **Arguments:** `guard`; `arrays`, this rank's local blocks (one
    decomposition for all); `src`, `dst`, decompositions of one global shape
    over the same number of ranks.

    **Returns:** the new local blocks (fresh arrays).
    """
    MPI = mpi_module()
    rank = guard.rank
    mine_src, mine_dst = src.block(rank), dst.block(rank)
    o_src, o_dst = src.offsets(rank), dst.offsets(rank)
    outs, reqs = [], []
    unpack: list[tuple[np.ndarray, tuple[slice, ...], np.ndarray]] = []  # received parts
    keep: list[np.ndarray] = []  # send buffers, alive until the wait
    for arr in arrays:
        out = np.empty(dst.local_shape(rank), arr.dtype)
        outs.append(out)
        for q in dst.ranks_overlapping(mine_src):
            box = box_intersection(mine_src, dst.block(q))
            if box is None:
                continue
            part = arr[_rel(box, o_src)]
            if q == rank:
                out[_rel(box, o_dst)] = part
            else:
                buf = np.ascontiguousarray(part)
                reqs.append(guard.comm.Isend([buf, MPI.BYTE], dest=q, tag=_P2P))
                keep.append(buf)
        for q in src.ranks_overlapping(mine_dst):
            if q == rank:
                continue
            box = box_intersection(mine_dst, src.block(q))
            if box is None:
                continue
            buf = np.empty(tuple(hi - lo for lo, hi in box), arr.dtype)
            reqs.append(guard.comm.Irecv([buf, MPI.BYTE], source=q, tag=_P2P))
            unpack.append((out, _rel(box, o_dst), buf))
    guard.wait(reqs, "moving checkpoint blocks between decompositions")
    for out, where, buf in unpack:
        out[where] = buf
    return outs


def gather_blocks(comm, darr, root: int = 0):
    """The global array of the :class:`DistributedArray` `darr` on rank
    `root` (``None`` elsewhere).  Collective (blocking MPI calls)."""
    MPI = mpi_module()
    d = darr.decomposition
    if d.nranks != comm.Get_size():
        raise VlccValueError(
            f"the decomposition has {d.nranks} ranks, the communicator {comm.Get_size()}"
        )
    local = np.ascontiguousarray(darr.local)
    sizes = [int(np.prod(d.local_shape(r))) * local.itemsize for r in range(d.nranks)]
    if comm.Get_rank() == root:
        buf = np.empty(sum(sizes), np.uint8)
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        comm.Gatherv([local, MPI.BYTE], [buf, (sizes, displs.tolist()), MPI.BYTE], root=root)
        out = np.empty(d.global_shape, local.dtype)
        for r in range(d.nranks):
            part = buf[displs[r] : displs[r] + sizes[r]].view(local.dtype)
            out[d.slices(r)] = part.reshape(d.local_shape(r))
        return out
    comm.Gatherv([local, MPI.BYTE], None, root=root)
    return None
