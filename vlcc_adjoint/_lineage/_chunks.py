"""The content-addressed chunk files of a repository: storing, linking, delta chains.

A chunk is stored once, in ``chunks/<2 hex>/<30 hex>`` under its address
(:func:`._format.address_of`), by whichever commit first needs it: written
to a scratch file and hard-linked into place (``link`` fails if the chunk
appeared meanwhile, so concurrent writers never duplicate an inode).  A
version's zarr group then holds hard links to those files at the chunk keys
zarr expects (:meth:`ChunkStore.link`; a copy where the file system refuses
hard links).  In a repository with delta chunks (:mod:`._delta`) a new chunk
may be stored as a delta object against its parent's chunk at the same
place; the :class:`~._delta.Resolver` reads such chains back, verified.

:class:`ChunkStore` is this part of :class:`~vlcc_adjoint.lineage.History`.
Every ``chunks/<2 hex>/`` directory is checked to be a real directory (never
a link) before a file in it is read or written (:meth:`ChunkStore.chunk_path`).
"""

from __future__ import annotations

import copy
import errno
import os
import shutil

from ..errors import VlccValueError
from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _delta
from . import _format as F
from ._format import Layout
from ._repo import Repository

__all__ = ["ChunkStore"]

#: errno values of a file system that refuses a hard link (a copy is made instead).
LINK_UNSUPPORTED = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.EACCES}
)


class ChunkStore:
    """The chunk files of the repository `repo` (see the module docstring).

    **Arguments:** `repo`, the :class:`~._repo.Repository`; `deltas`, the
    ``History`` argument of that name (``None``: as the repository's root says).

    **Attributes:** `repo`; `resolver`, the :class:`~._delta.Resolver` of
    delta chains (with its cache of resolved chunks).
    """

    def __init__(self, repo: Repository, deltas: bool | None) -> None:
        self.repo = repo
        self._dirs: set[str] = set()  # chunks/<2 hex> directories checked to be real ones
        self._links = True  # hard links work on this file system (until one is refused)
        self._deltas = self._enable(deltas)
        self.resolver = _delta.Resolver(self)

    # -- the delta setting ----------------------------------------------------------

    @property
    def deltas(self) -> bool:
        """Whether this repository stores changed chunks as deltas."""
        return self._deltas

    def recheck_deltas(self) -> bool:
        """Whether the repository stores deltas, re-read from its root (another
        process may have turned them on since this one opened it)."""
        if not self._deltas and self._enable(None):
            self._deltas = True
        return self._deltas

    def _enable(self, want: bool | None) -> bool:
        """Whether the repository stores deltas; with `want`, record it in the root.

        Once a repository has deltas, it keeps them (its versions need them):
        ``deltas=False`` on such a repository raises ``ValueError``.
        """
        repo = self.repo
        attrs = repo.root_attrs() or {}
        has = attrs.get("deltas") is True
        if want is None or bool(want) == has:
            return has
        if not want:
            raise VlccValueError(
                f"the history at {repo.path} stores delta chunks (it was created with "
                "deltas=True); open it with deltas=None or deltas=True"
            )
        if repo.mode != "a":
            raise VlccValueError("deltas=True needs mode='a' (it records the setting in the root)")
        repo.write_root({**attrs, "deltas": True})
        return True

    def uncached(self) -> ChunkStore:
        """A chunk store of the same repository and delta setting that has read
        nothing yet (no checked directories, an empty resolver cache), so that
        every chunk it resolves is read from disk: ``vlcc verify``'s."""
        other = copy.copy(self)
        other._dirs = set()
        other.resolver = _delta.Resolver(other)
        return other

    # -- paths -----------------------------------------------------------------------

    def chunk_path(self, addr: str) -> str:
        """The file of chunk `addr`, whose ``chunks/<2 hex>/`` directory is checked
        to be a real one (``FileNotFoundError`` when there is none yet)."""
        sub = addr[:2]
        if sub not in self._dirs:
            SF.check_dir(self.repo.p(F.CHUNKS, sub))
            self._dirs.add(sub)
        return self.repo.p(F.CHUNKS, sub, addr[2:])

    def exists(self, addr: str) -> bool:
        """Whether chunk `addr` is stored (as a full chunk or a delta object)."""
        return os.path.lexists(self.repo.p(F.chunk_relpath(addr)))

    def closure(self, addrs: set[str]) -> set[str]:
        """`addrs` and every base their delta objects need (transitively)."""
        if not self.recheck_deltas():
            return addrs
        return _delta.closure(self, addrs)

    # -- writing ----------------------------------------------------------------------

    def store(self, addr: str, data, cfg: dict | None, base: str | None, layout: Layout) -> int:
        """Write chunk `addr` (raw bytes `data`, codec `cfg`) unless it is there;
        return the bytes written.

        With `base` (a delta repository), the chunk is stored as a delta object
        against the chunk `base` when that pays (:mod:`._delta`).
        """
        repo = self.repo
        sub = addr[:2]
        final = repo.p(F.CHUNKS, sub, addr[2:])
        if os.path.lexists(final):
            return 0
        blob = None
        if base and base != addr:
            blob = self._delta_blob(addr, data, cfg, base, layout)
        if blob is None:
            blob = F.encode_chunk(data, cfg)
            if self._deltas:
                self.resolver.remember(addr, data, 0, 0)
        if sub not in self._dirs:
            SF.make_dir(repo.p(F.CHUNKS, sub))  # a real directory, never a link
            self._dirs.add(sub)
        tmp = repo.p(F.SCRATCH, f"c-{F.token()}")
        SF.write_file(tmp, blob, repo.durable, exclusive=True)
        try:
            try:
                os.link(tmp, final)
            except FileExistsError:
                return 0  # another process stored it meanwhile
            except OSError as err:
                if err.errno not in LINK_UNSUPPORTED:
                    raise
                os.replace(tmp, final)
            if repo.durable:
                SF.fsync_dir(repo.p(F.CHUNKS, sub))
            return len(blob)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _delta_blob(
        self, addr: str, data, cfg: dict | None, base: str, layout: Layout
    ) -> bytes | None:
        """The delta object for chunk `addr` against `base`, or ``None`` when a full
        chunk is better (the delta is above :data:`._delta.MAX_FRACTION` of a chunk, or its
        chain too long)."""
        n = layout.chunk_nbytes
        if not self.exists(base):
            return None  # removed by gc (the resolver may still cache it): store in full
        try:
            braw, depth, chain = self.resolver.get(base, n, cfg, _delta.MAX_DEPTH)
        except (FileNotFoundError, CorruptCheckpointError):
            return None  # the base is gone or damaged: store this chunk in full
        if depth + 1 > _delta.MAX_DEPTH:
            return None
        blob = _delta.encode(data, braw, base, depth, chain, layout.dtype.itemsize)
        if len(blob) > _delta.MAX_FRACTION * n or chain + len(blob) > 2 * n:
            return None
        self.resolver.remember(addr, data, depth + 1, chain + len(blob))
        return blob

    def link(self, addr: str, dst: str) -> None:
        """Put the chunk file at `dst` in a version group: a hard link (no space), else a copy."""
        src = self.repo.p(F.CHUNKS, addr[:2], addr[2:])
        if self._links:
            try:
                os.link(src, dst)
                return
            except FileNotFoundError:
                raise StorageError(
                    f"chunk {addr} is missing from {self.repo.path}/chunks (it was to "
                    "be written by an earlier commit of this process that failed)"
                ) from None
            except OSError as err:
                if err.errno not in LINK_UNSUPPORTED:
                    raise
                if err.errno != errno.EMLINK:  # too many links to this one file: copy just it
                    self._links = False
        shutil.copyfile(src, dst, follow_symlinks=False)
