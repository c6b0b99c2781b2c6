"""File locks that serialise writers of one repository across processes.

Two ``flock(2)`` locks, on two files in ``locks/``:

* ``graph.lock`` (exclusive, held for milliseconds): whoever rewrites the
  graph file (a commit publishing its version, ``branch``, ``tag``,
  ``checkout`` of a branch, ``gc``) reads the current graph, changes it and
  replaces it atomically while holding it, so two processes never lose each
  other's updates (a read-modify-write race).
* ``gc.lock`` (a readers-writer lock): a commit holds it *shared* from the
  moment it decides which chunks already exist until its version is
  published, and a read holds it shared while it reads chunks; ``gc`` holds
  it *exclusive*.  So a chunk that a commit found on disk (and therefore did
  not copy or write) cannot be collected before the version that uses it is
  visible, and a version being read cannot disappear under its reader.  While
  gc holds it exclusive, nothing is in flight anywhere: every scratch entry
  is debris of a dead process.

Locks are always taken in that order (``gc.lock``, then ``graph.lock``), so
they cannot deadlock.  ``flock`` locks belong to an open file description:
the kernel drops them when a process dies (``kill -9`` included), and two
``History`` objects in one process exclude each other like two processes.
Within one object, threads share the file descriptor, so the counting
below (threading primitives) does the in-process part.  A ``fork``ed child
shares its parent's descriptors and locks: open a new ``History`` in the
child (``History`` refuses calls across a fork).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

from ..storage import StorageError
from ..storage import format as SF


def _open(path: str, readonly: bool) -> int | None:
    """A descriptor of the lock file `path`: a regular file, never reached through a link
    (created exclusively when missing, so a link in its place is refused, not followed)."""
    if not readonly:
        try:
            SF.write_file(path, b"", False, exclusive=True)
        except FileExistsError:
            pass
    try:
        return SF.open_regular(path, os.O_RDONLY if readonly else os.O_RDWR)
    except StorageError:
        raise
    except OSError:
        if readonly:  # a repository on read-only media: nothing can change it, no lock needed
            return None
        raise


class FileLock:
    """An exclusive inter-process lock (``flock``) that threads of one process share."""

    def __init__(self, path: str, readonly: bool = False):
        self._fd = _open(path, readonly)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def held(self):
        with self._lock:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SharedExclusiveLock:
    """A readers-writer lock across processes (``flock`` shared/exclusive),
    counted within the process so that threads may hold it shared together."""

    def __init__(self, path: str, readonly: bool = False):
        self._fd = _open(path, readonly)
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def acquire_shared(self) -> None:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            if self._shared == 0 and self._fd is not None:
                # Nobody in this process holds it: take the file lock.  Blocks
                # while another process runs gc.
                fcntl.flock(self._fd, fcntl.LOCK_SH)
            self._shared += 1

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            if self._shared == 0:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self):
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            while self._exclusive or self._shared:
                self._cond.wait()
            self._exclusive = True
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # waits for other processes' commits and reads
            try:
                yield
            finally:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive_nowait(self):
        """Hold the lock exclusive if nobody (in any process) holds it; yields whether it does."""
        with self._cond:
            if self._exclusive or self._shared:
                got = False
            else:
                self._exclusive = got = True
        if not got:
            yield False
            return
        try:
            if self._fd is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    got = False
            try:
                yield got
            finally:
                if got and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
