"""Whole-buffer reads and writes on raw file descriptors.

The system-call loops under :mod:`vlcc_adjoint.storage.format`, through
which the zarr tier, the MPI store and the lineage repository write chunks
and metadata with ``os.write`` and read them with ``os.readv`` straight
into their numpy buffers, without Python file objects.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["O_CLOEXEC", "O_NOFOLLOW", "fsync_dir", "fsync_paths", "read_exactly", "write_all",
           "write_file"]

#: ``os.O_CLOEXEC`` where the platform has it: descriptors are not inherited
#: by subprocesses (an MPI launcher, a user's ``subprocess.run``).
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: ``os.O_NOFOLLOW`` where the platform has it: a symbolic link in place of
#: a store's file is refused (``ELOOP``), never written through.
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

#: Bytes per ``os.write`` call (Linux writes at most about 2 GiB at once).
_WRITE_SLICE = 1 << 30


def write_all(fd: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
    """Write every byte of the bytes-like `data` to `fd`."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    while view:
        n = os.write(fd, view[:_WRITE_SLICE])
        view = view[n:]


def write_file(path: str, data: bytes | bytearray | memoryview | np.ndarray, durable: bool, *,
               truncate: bool = False, exclusive: bool = False) -> None:
    """Write `data` at `path`; fsync it when `durable`.

    By default the file is created or written over from its start, not
    truncated: the caller knows it is new or not longer than `data` (the
    zarr tier pads its metadata), which saves the truncation's block
    freeing.  `truncate` cuts what is left beyond `data`; `exclusive`
    refuses an existing file (``FileExistsError``).  A symbolic link at
    `path` is never followed (``OSError`` with ``ELOOP``): a store never
    writes outside itself through a link planted in it.
    """
    flags = (os.O_WRONLY | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW | (os.O_TRUNC if truncate else 0)
             | (os.O_EXCL if exclusive else 0))
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_exactly(fd: int, view: memoryview) -> bool:
    """Fill the byte view `view` from `fd`; ``False`` if the file ended first."""
    done, size = 0, len(view)
    while done < size:
        n = os.readv(fd, [view[done:]])
        if n == 0:
            return False
        done += n
    return True


def fsync_dir(path: str) -> None:
    """fsync the directory `path`, so that the entries just made in it are durable."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_paths(paths: list[str], uncache: int = 0) -> None:
    """fsync each file or directory in `paths` (never through a symbolic link).

    Writing a set of files first and syncing them after lets one device
    flush (and, on journalling file systems, one journal commit) cover them
    all: the first ``fsync`` waits for the data and metadata, the others
    find them already on the device.  The first `uncache` paths (files)
    then leave the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` of
    their pages, clean once synced; nothing where the platform lacks it).
    """
    for k, path in enumerate(paths):
        fd = os.open(path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        try:
            os.fsync(fd)
            if k < uncache and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
