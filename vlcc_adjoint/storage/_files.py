"""Whole-buffer reads and writes on raw file descriptors.

The system-call loops under :mod:`vlcc_adjoint.storage.format` (which
opens, checks and publishes the files), through which the zarr tier, the
MPI store and the lineage repository write chunks and metadata with
``os.write`` and read them with ``os.readv`` straight into their numpy
buffers, without Python file objects.

Direct reads (:func:`read_direct`): a file whose pages are not in the page
cache (the durable zarr tier drops its chunks from it once they are
synced) is read fastest by letting the device write into the destination
(``O_DIRECT``, Linux ``open(2)``): a buffered read fills page-cache pages
first and then copies them, a second pass over every byte.  Direct I/O asks
that the buffer, the file offset and the length be multiples of the
device's logical block size; pages (4096 bytes) are a multiple of every
common one (512 or 4096).  The kernel keeps such reads coherent with the
page cache (dirty pages of the range are written back first).
"""

from __future__ import annotations

import errno
import fcntl
import os

import numpy as np

__all__ = [
    "DIRECT_MIN",
    "O_CLOEXEC",
    "O_NOFOLLOW",
    "read_direct",
    "read_exactly",
    "write_all",
]

#: ``os.O_CLOEXEC`` where the platform has it: descriptors are not inherited
#: by subprocesses (an MPI launcher, a user's ``subprocess.run``).
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: ``os.O_NOFOLLOW`` where the platform has it: a symbolic link in place of
#: a store's file is refused (``ELOOP``), never written through.
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

#: Bytes per ``os.write`` call (Linux writes at most about 2 GiB at once).
_WRITE_SLICE = 1 << 30

#: Smallest read worth direct I/O (below it the system calls cost more than the copy).
DIRECT_MIN = 1 << 20

#: Direct I/O alignment: buffer address, file offset and length (a page).
_DIRECT_ALIGN = 4096

#: Bytes per direct read request (large enough to keep the device busy).
_DIRECT_SLICE = 8 << 20

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def write_all(fd: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
    """Write every byte of the bytes-like `data` to `fd`."""
    view = data.data.cast("B") if isinstance(data, np.ndarray) else memoryview(data).cast("B")
    while view:
        n = os.write(fd, view[:_WRITE_SLICE])
        view = view[n:]


def read_exactly(fd: int, view: memoryview) -> bool:
    """Fill the byte view `view` from `fd`; ``False`` if the file ended first."""
    done, size = 0, len(view)
    while done < size:
        n = os.readv(fd, [view[done:]])
        if n == 0:
            return False
        done += n
    return True


def read_direct(fd: int, view: memoryview, address: int) -> int:
    """Read the whole pages at the start of the byte view `view` (whose
    first byte is at memory `address`) from `fd`, at its offset 0, with
    direct I/O; the number of bytes read.

    Reads nothing (returns 0) where direct I/O is not possible: no
    ``O_DIRECT`` on this platform, a buffer not aligned to a page, a file
    system that refuses it (``EINVAL``), or less than a page to read.  A
    file that ends first stops the read at its end.  `fd` is left at the
    offset read up to, in its original (buffered) mode, so that the caller
    reads the rest as usual.
    """
    body = len(view) - len(view) % _DIRECT_ALIGN
    if not _O_DIRECT or address % _DIRECT_ALIGN or not body:
        return 0
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError as err:
        if err.errno == errno.EINVAL:  # the file system has no direct I/O
            return 0
        raise
    done = 0
    try:
        while done < body:
            n = os.readv(fd, [view[done : min(body, done + _DIRECT_SLICE)]])
            done += n
            if n == 0 or n % _DIRECT_ALIGN:
                break  # the file ended (a short last page): read on buffered
    except OSError as err:
        if err.errno != errno.EINVAL:  # EINVAL: an alignment the device refuses
            raise
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done
