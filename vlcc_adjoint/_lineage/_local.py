"""The node-local tier: ``History(path, comm=comm, local=dir)``.

A distributed commit (:mod:`._ranks`) writes every rank's chunks to the
shared path before it returns: the ranks wait for the parallel file system.
With ``local=dir`` (a RAM disk such as ``/dev/shm`` or a node-local SSD) a
commit only copies each rank's leaves into ``dir`` and returns; a background
thread per node moves the version to the shared path, aggregated, as
VeloC does (Nicolae et al., IPDPS'19) - but the version then joins the
history like any other.

Commit (collective, in the caller's thread)
-------------------------------------------

1. The pending version of the previous commit, if any, is finished first
   (see *Publication*): **one** version in flight per History, so node-local
   memory holds at most one copy of each rank's state, and a second commit
   waits for the first's flush.
2. The state is checked as a distributed commit checks it
   (:meth:`._ranks.RankGroup.prepare`: structure, decompositions, agreed).
3. Each rank copies the leaves it writes (its blocks; rank 0 the replicated
   values too) into its staging file ``dir/vlcc-<session>/rank<r>.stage``,
   one ``memcpy`` per leaf into a memory map that is kept and reused from
   commit to commit (its pages are touched once, not per commit), at the
   places :func:`layout_of` gives (the same function on every rank: the
   node's leader, rank 0 of ``comm.Split_type(COMM_TYPE_SHARED)``, knows
   where each of its ranks' leaves are without a message).  Rank 0 chose the
   version's id in step 2 (shared in the same message as the check).  The
   outcome is agreed: a failure anywhere is the same
   :class:`~vlcc_adjoint.mpi.AgreedError` everywhere, and nothing is pending.
4. The leader hands the version to its node's flush thread (started when
   the History was opened, waiting for work) and ``commit`` returns the id.
   Blocked time: the copy and four small collectives (the first commit also
   touches the staging map's pages once).

Flush (background, one thread per node, on the node leader)
-----------------------------------------------------------

The leader's thread maps each of its node's ranks' staging files, cuts every
leaf into chunks, hashes them and writes the chunks the repository lacks
into **one pack** (:mod:`._packs`) in ``scratch/``, fsynced and then linked
into ``packs/`` (file and directory fsynced), under ``locks/gc.lock`` held
shared.  Its result, the leaf entries of each of the node's ranks and the
pack's name, stays in memory.  The thread makes no MPI call (no
``MPI_THREAD_MULTIPLE`` is needed).

Publication (collective: the next ``commit``, ``wait``, ``close``, ``gc``
or ref change)
------------------------------------------------------------------

Each leader waits for its thread's flush; the ranks agree on the outcome (a flush's
error becomes the same :class:`~vlcc_adjoint.mpi.AgreedError` on every
rank); the leaders' results are gathered on rank 0, which publishes the
version as a packed version (:func:`._parts.commit_staged`: manifest only,
``"zarr_view": false``, every pack checked to exist) with the id returned
by ``commit`` (rank 0 reads the other nodes' pack indexes to check every
chunk is on disk); the outcome is agreed again.  A ``gc`` run by another
process between a pack's flush and its publication removes the pack (no
version references it yet): the publication then fails, on every rank, and
the version is not added (this History's own ``gc`` publishes first).  Until then the version is not
in the graph: other processes, and this one's ``log``/``load``, do not see
it.  A version whose flush failed is never published (its id stays unused).

Crashes
-------

The staging files are scratch: nothing on the shared path refers to them.
A process killed during a flush leaves at most a partial pack in
``scratch/`` and complete packs no version references; the graph gains
the version only in rank 0's publication (one atomic ``os.replace``) after
every node's pack is durable.  A restart, on any number of ranks, sees
exactly the versions published before the crash, each readable; ``gc``
sweeps the rest.  Surviving ranks leave their next collective call with
:class:`~vlcc_adjoint.mpi.CollectiveTimeoutError` after the History's
`timeout` (or are ended by ``mpiexec``).  The leader holds an ``flock`` on
``vlcc-<session>/session.lock`` while its History is open (the file
appears already locked: it is locked under a scratch name, then renamed),
and the kernel releases it when the leader dies; a leader opening a History
removes the staging directories in ``dir`` whose lock it can take (their
sessions' leaders are dead) and leaves those without a lock file (being
made).

Files on the shared path per version: one pack per node, the version's
manifest (one group, one ``zarr.json``) and the graph file, whatever the
number of leaves, chunks and ranks per node.  Deltas are not made by the
flush (full chunks only; a ``deltas=True`` repository reads packed versions
as any other).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import mmap
import os
import queue
import re
import secrets
import shutil
import stat
import threading
from typing import Any

import numpy as np

from ..errors import VlccValueError
from ..mpi import Guard, split_by_node
from ..state import byte_view, dtype_from_json, dtype_to_json
from ..storage import format as SF
from ._parts import stage
from ._ranks import CommitPlan, RankGroup

__all__ = ["NodeLocal"]

#: Leaves start at multiples of this in a staging file.
_ALIGN = 64


def layout_of(plan: CommitPlan, rank: int) -> tuple[list[dict], int]:
    """Where rank `rank` stages its leaves of `plan` (its blocks, on rank 0 the
    replicated values too, in leaf order): ``{"dtype", "shape", "offset"}``
    each, and the staging file's size.  The same on every rank, since the
    ranks' structures were agreed equal: the leader reads its node's files
    with it, no message needed."""
    out: list[dict] = []
    at = 0
    for i, leaf in enumerate(plan.leaves):
        if i not in plan.dist and rank != 0:
            continue
        shape = plan.dist[i].local_shape(rank) if i in plan.dist else leaf.shape
        out.append({"dtype": dtype_to_json(leaf.dtype), "shape": list(shape), "offset": at})
        nbytes = int(np.prod(shape, dtype=np.int64)) * leaf.dtype.itemsize
        at += -(-nbytes // _ALIGN) * _ALIGN
    return out, max(at, _ALIGN)


class _Pending:
    """The version in flight: its id, and (rank 0) what its publication needs."""

    def __init__(
        self,
        vid: str,
        plan: CommitPlan,
        message: str,
        meta: dict | None,
        branch: str | None,
    ) -> None:
        self.vid = vid
        self.plan = plan
        self.message = message
        self.meta = meta
        self.branch = branch
        self.done = threading.Event()  # set by the leader's flush thread (others: at once)
        self.result: dict | None = None  # the leader's flush: {"ranks": {r: entries}, "pack": name}
        self.error: BaseException | None = None


#: The staging directory of a session in the node-local directory.
_SESSION_DIR = re.compile(r"vlcc-[0-9a-f]{16}")
#: The file whose ``flock`` the session's leader holds while it lives.
_SESSION_LOCK = "session.lock"


def _locked_session_file(session_dir: str) -> int:
    """The descriptor of ``session_dir/session.lock``, locked (``flock``,
    exclusive) before the file appears under its name: a sweep never sees
    it unlocked while its session lives."""
    tmp = SF.scratch_name(os.path.join(session_dir, _SESSION_LOCK))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, os.path.join(session_dir, _SESSION_LOCK))
    except BaseException:
        os.close(fd)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return fd


def sweep_dead_sessions(local: str) -> list[str]:
    """Remove the staging directories in `local` whose session's leader is
    dead (its ``session.lock`` can be locked); return their paths.

    A directory without that file (a session being made) and anything that
    is not a real directory named like a session are left alone; a
    directory is removed while its lock is held, without following links.
    """
    removed = []
    for entry in os.scandir(local):
        if not (_SESSION_DIR.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
            continue
        try:
            fd = os.open(
                os.path.join(entry.path, _SESSION_LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:
            continue  # no lock file (being made), a link, or gone
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its leader lives
            SF.remove_tree(entry.path, local)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


class NodeLocal:
    """The node-local tier of a :class:`~vlcc_adjoint.lineage.History` opened
    with ``comm=`` and ``local=`` (see the module docstring).

    **Arguments:**

    - `ranks`: the History's :class:`~._ranks.RankGroup` (its pipeline attached).
    - `local`: the node-local directory; created if missing.  Each History
      stages in its own ``vlcc-<session>/`` directory there.
    - `node_comm`: the ranks that share `local` and one pack (``History``'s
      `local_comm`); ``None``: :func:`vlcc_adjoint.mpi.split_by_node`.

    Creating one is collective (it splits the communicator by node).
    """

    def __init__(self, ranks: RankGroup, local: str, node_comm: Any = None) -> None:
        self.ranks = ranks
        guard = ranks.guard
        if node_comm is None:
            node = split_by_node(guard.comm)
            self.node = Guard(node, timeout=guard.timeout)
            node.Free()
        else:  # the caller's grouping (the guard works on a duplicate of it)
            self.node = Guard(node_comm, timeout=guard.timeout)
        self.leader = self.node.rank == 0
        #: The world ranks of this node's ranks (the leader packs their files).
        self.members = [
            int(r)
            for r in self.node.allgather(np.array([ranks.rank], np.int64), "listing a node's ranks")
            .reshape(-1)
            .tolist()
        ]
        session = ranks.share(secrets.token_hex(8).encode(), "naming the staging directory")
        self.dir = os.path.join(os.path.abspath(local), f"vlcc-{session.decode()}")
        self.file = os.path.join(self.dir, f"rank{ranks.rank}.stage")
        self._map: mmap.mmap | None = None
        self._pending: _Pending | None = None
        self._jobs: queue.SimpleQueue[tuple[_Pending, list[list]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if self.leader:
            self._thread = threading.Thread(
                target=self._flusher, name="vlcc-node-local-flush", daemon=True
            )
            self._thread.start()
        self._session_lock: int | None = None
        error: BaseException | None = None
        try:
            os.makedirs(local, exist_ok=True)
            if self.leader:
                sweep_dead_sessions(local)
            try:
                os.mkdir(self.dir)
            except FileExistsError:
                SF.check_dir(self.dir)  # another rank of this node made it
            if self.leader:
                self._session_lock = _locked_session_file(self.dir)
        except Exception as err:
            error = err
        guard.agree(error, f"creating the node-local staging directory in {local}")

    # -- commit ------------------------------------------------------------------------

    def commit(self, state: Any, message: str, meta: dict | None, branch: str | None) -> str:
        """``History.commit`` with ``local=`` (collective; see the module docstring)."""
        ranks, guard = self.ranks, self.ranks.guard
        self.finish()
        plan = ranks.prepare(state, branch, announce=self._new_id)
        vid = plan.announced
        error: BaseException | None = None
        try:
            self._copy(plan, [plan.leaves[i] for i in plan.mine])
        except Exception as err:
            error = err
        guard.agree(error, "copying the state to node-local storage")
        # The pending version keeps no reference to the caller's arrays (their
        # copies are staged): memory held per pending version is the copy.
        pending = _Pending(vid, dataclasses.replace(plan, leaves=[]), message, meta, branch)
        if self.leader:
            # Every rank's layout follows from the plan (the ranks' structures
            # were agreed equal): no message.  Handed to the flush thread, which
            # waits for work: no thread start in the caller's time.
            staged = [[r, layout_of(plan, r)[0]] for r in self.members]
            self._jobs.put((pending, staged))
        else:
            pending.done.set()
        self._pending = pending
        return vid

    def _new_id(self) -> str:
        """Rank 0: the id the pending version will have: 48 random bits, free in
        the graph as last read (publication checks it against the current one
        and fails rather than publish under another id)."""
        pipeline = self.ranks.pipeline
        with pipeline.repo.lock:
            return pipeline.new_id(pipeline.repo.graph)

    def _copy(self, plan: CommitPlan, leaves: list[np.ndarray]) -> None:
        """Copy `leaves` (this rank's, of `plan`) into this rank's staging file
        (grown when too small), at the places :func:`layout_of` gives them."""
        layout, size = layout_of(plan, self.ranks.rank)
        for leaf, entry in zip(leaves, layout):
            if list(leaf.shape) != entry["shape"]:
                raise VlccValueError(
                    f"a block of shape {leaf.shape} where its decomposition gives "
                    f"{tuple(entry['shape'])}; give each DistributedArray its own block"
                )
        if self._map is None or len(self._map) < size:
            if self._map is not None:
                self._map.close()
                self._map = None
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size)
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        buf = np.frombuffer(self._map, np.uint8)
        for leaf, entry in zip(leaves, layout):
            src = byte_view(np.ascontiguousarray(leaf))
            buf[entry["offset"] : entry["offset"] + len(src)] = src

    # -- the flush (the node leader's thread: no MPI here) -------------------------------

    def _flusher(self) -> None:
        """The leader's flush thread: one pending version at a time, until ``None``."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            pending, staged = job
            try:
                pending.result = self._pack(staged)
            except BaseException as err:  # reported at the next collective call
                pending.error = err
            finally:
                pending.done.set()

    def _pack(self, staged: list[list]) -> dict:
        """Write the node's ranks' staged leaves into one pack; their entries."""
        pipeline = self.ranks.pipeline
        repo = pipeline.repo
        entries: dict[str, list[dict]] = {}
        with repo.gc_lock.shared():  # gc must not sweep the pack before publication
            writer = pipeline.chunks.new_pack()
            try:
                for rank, layout in sorted(staged, key=lambda x: x[0]):
                    arrays = self._staged_arrays(int(rank), layout)
                    entries[str(rank)] = stage(pipeline, arrays, None, None, pack=writer)
                    del arrays
                pack = pipeline.chunks.publish_pack(writer, durable=True) if len(writer) else None
            except BaseException:
                writer.abort()
                raise
        return {"ranks": entries, "pack": pack}

    def _staged_arrays(self, rank: int, layout: list[dict]) -> list[np.ndarray]:
        """The leaves rank `rank` (of this node) staged, as arrays over its file."""
        path = os.path.join(self.dir, f"rank{rank}.stage")
        fd, size = SF.open_sized(path)
        try:
            if size == 0:
                return []
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        buf = np.frombuffer(mapped, np.uint8)
        out = []
        for entry in layout:
            dtype = dtype_from_json(entry["dtype"])
            shape = tuple(int(n) for n in entry["shape"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            at = int(entry["offset"])
            if at + nbytes > size:
                raise VlccValueError(f"the staging file {path} is shorter than its leaves")
            out.append(buf[at : at + nbytes].view(dtype).reshape(shape))
        return out

    # -- publication (collective) ----------------------------------------------------------

    def finish(self) -> None:
        """Wait for the pending version's flush and publish it (collective;
        see the module docstring).  Raises the flush's or the publication's
        failure as the same :class:`~vlcc_adjoint.mpi.AgreedError` on every rank."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None  # whatever happens, this version is done with
        ranks, guard = self.ranks, self.ranks.guard
        what = f"flushing version {pending.vid} from node-local storage"
        pending.done.wait()
        guard.agree(pending.error, what)
        mine = json.dumps(pending.result if self.leader else None).encode()
        parts = guard.gatherv(np.frombuffer(mine, np.uint8), 0, what)
        error: BaseException | None = None
        if ranks.rank == 0:
            assert parts is not None
            try:
                by_rank: dict[int, list[dict]] = {}
                packs: list[str] = []
                for part in parts:
                    result = json.loads(part.tobytes())
                    if result is None:
                        continue
                    by_rank.update({int(r): e for r, e in result["ranks"].items()})
                    if result["pack"] is not None:
                        packs.append(result["pack"])
                if sorted(by_rank) != list(range(ranks.size)):
                    raise VlccValueError(f"the flush staged ranks {sorted(by_rank)}")
                ranks.publish(
                    pending.plan,
                    [by_rank[r] for r in range(ranks.size)],
                    pending.message,
                    pending.meta,
                    pending.branch,
                    packs,
                    pending.vid,
                )
            except Exception as err:
                error = err
        guard.agree(error, f"publishing version {pending.vid}")
        ranks.switched(pending.branch)

    @property
    def pending(self) -> str | None:
        """The id of the version committed and not published yet, if any."""
        return None if self._pending is None else self._pending.vid

    def close(self) -> None:
        """Publish what is pending (collective), then remove this rank's staging
        file (and the node's directory, on the leader)."""
        try:
            self.finish()
        finally:
            if self._map is not None:
                self._map.close()
                self._map = None
            try:
                os.unlink(self.file)
            except OSError:
                pass
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None
            if self.leader:  # the flush is over: nobody reads the staging files now
                shutil.rmtree(self.dir, ignore_errors=True)
                if self._session_lock is not None:
                    os.close(self._session_lock)
                    self._session_lock = None
            self.node.close()
