"""The content-addressed chunks of a repository: loose files, packs, delta chains.

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

A chunk may also be an entry of a pack (``packs/<32 hex>.pack``, :mod:`._packs`,
written by the node-local tier's flush).  Every read resolves an address here,
in one place: the loose file if there is one, else the entry of a pack
(:meth:`ChunkStore.read_blob`, :meth:`ChunkStore.read_into`,
:meth:`ChunkStore.read_head`); so deduplication by address, delta chains and
verification work across loose chunks and packs alike.  The packs' indexes
are read once per process and kept (packs are immutable); an address found
in no loose file and no known pack makes the store look for packs added
since (one listing of ``packs/``).
"""

from __future__ import annotations

import copy
import errno
import os
import secrets
import shutil
import threading

from ..errors import VlccValueError
from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _delta
from . import _format as F
from ._format import Layout
from ._packs import PackEntry, PackWriter, is_pack_name, read_index
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
        self._pack_lock = threading.Lock()
        self._packs: dict[str, dict[str, PackEntry]] = {}  # pack name -> its index
        self._where: dict[str, PackEntry] = {}  # address -> its entry in a pack
        self._pack_damage: dict[str, CorruptCheckpointError] = {}  # pack name -> why unreadable

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
        other._pack_lock = threading.Lock()
        other._packs, other._where, other._pack_damage = {}, {}, {}
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
        """Whether chunk `addr` is stored (as a full chunk or a delta object,
        loose or in a pack this process knows)."""
        return addr in self._where or os.path.lexists(self.repo.p(F.chunk_relpath(addr)))

    def present(self, addr: str, look: bool = False) -> bool:
        """Whether chunk `addr` is on disk now: its loose file, or the pack file
        holding it (what a version published without links checks, under the
        gc lock held shared).  With `look`, packs written since this process
        last looked (by other nodes' flushes) are looked for when `addr` is in
        none it knows."""
        if os.path.lexists(self.repo.p(F.chunk_relpath(addr))):
            return True
        entry = self._where.get(addr)
        if entry is None and look:
            self.scan_packs()
            entry = self._where.get(addr)
        return entry is not None and os.path.lexists(entry.path)

    def stored_size(self, addr: str) -> int:
        """The bytes chunk `addr` takes on disk (its loose file, else its pack
        entry); 0 when it is in neither."""
        try:
            return os.lstat(self.repo.p(F.chunk_relpath(addr))).st_size
        except OSError:
            entry = self._where.get(addr)
            return entry.length if entry is not None else 0

    # -- packs ---------------------------------------------------------------------------

    def scan_packs(self) -> dict[str, set[str] | None]:
        """Read the indexes of the packs in ``packs/`` not read yet; return
        ``{pack name: its addresses}`` of every pack there (``None``: a pack
        whose index is damaged, kept in :attr:`pack_damage`)."""
        root = self.repo.p(F.PACKS)
        try:
            SF.check_dir(root)
            names = [n for n in os.listdir(root) if is_pack_name(n)]
        except FileNotFoundError:
            return {}
        out: dict[str, set[str] | None] = {}
        for name in names:
            with self._pack_lock:
                index = self._packs.get(name)
            if index is None and name not in self._pack_damage:
                try:
                    index = read_index(os.path.join(root, name))
                except FileNotFoundError:
                    continue  # removed by gc meanwhile
                except CorruptCheckpointError as err:
                    self._pack_damage[name] = err
                else:
                    self._remember_pack(name, index)
            out[name] = set(index) if index is not None else None
        return out

    @property
    def pack_damage(self) -> dict[str, CorruptCheckpointError]:
        """``{pack name: error}`` of the packs whose index did not read (met so far)."""
        return dict(self._pack_damage)

    def _remember_pack(self, name: str, index: dict[str, PackEntry]) -> None:
        with self._pack_lock:
            self._packs[name] = index
            for addr, entry in index.items():
                self._where.setdefault(addr, entry)

    def forget_packs(self, names: set[str] | None) -> None:
        """Drop removed packs (by gc) from what this process knows (``None``: all
        of them; they are read again when needed)."""
        with self._pack_lock:
            if names is None:
                self._packs, self._where, self._pack_damage = {}, {}, {}
                return
            for name in names:
                self._packs.pop(name, None)
                self._pack_damage.pop(name, None)
            self._where = {
                a: e for a, e in self._where.items() if os.path.basename(e.path) not in names
            }

    def packed(self, addr: str) -> PackEntry | None:
        """The pack entry of chunk `addr`, looking for new packs once when it is in
        none known; ``None`` when no pack holds it.  When a pack with a damaged
        index exists, that damage is raised (the chunk may be in that pack)."""
        entry = self._where.get(addr)
        if entry is None:
            self.scan_packs()
            entry = self._where.get(addr)
        if entry is None and self._pack_damage:
            raise next(iter(self._pack_damage.values()))
        return entry

    def new_pack(self) -> PackWriter:
        """A writer of a new pack, in ``scratch/`` until :meth:`publish_pack`."""
        return PackWriter(self.repo.p(F.SCRATCH, f"p-{F.token()}.pack"))

    def publish_pack(self, writer: PackWriter, durable: bool) -> str:
        """Finish the pack of `writer` (fsynced with `durable`) and move it into
        ``packs/`` (hard link: it appears whole); return its name."""
        repo = self.repo
        try:
            writer.finish(durable)
            SF.make_dir(repo.p(F.PACKS))  # a real directory, never a link
            name = f"{secrets.token_hex(16)}.pack"
            final = repo.p(F.PACKS, name)
            try:
                os.link(writer.path, final)
            except OSError as err:
                if err.errno not in LINK_UNSUPPORTED:
                    raise
                os.replace(writer.path, final)
            if durable:
                SF.fsync_dir(repo.p(F.PACKS))
        finally:
            if os.path.lexists(writer.path):
                os.unlink(writer.path)
        self._remember_pack(name, read_index(final))
        return name

    # -- reading -------------------------------------------------------------------------

    def read_blob(self, addr: str, limit: int) -> tuple[bytes, str]:
        """The stored bytes of chunk `addr` (at most `limit`, else
        ``CorruptCheckpointError``) and the file they came from (the loose
        file, else the pack); ``FileNotFoundError`` when it is in neither."""
        try:
            path = self.chunk_path(addr)
            return SF.read_limited(path, limit), path
        except FileNotFoundError:
            entry = self.packed(addr)
            if entry is None:
                raise
        data = entry.read(limit)
        return (data if isinstance(data, bytes) else bytes(data)), entry.path

    def read_into(self, addr: str, out: memoryview) -> str:
        """Fill `out` with the stored bytes of chunk `addr`, which must be exactly
        ``len(out)`` (a raw chunk); return the file they came from."""
        try:
            path = self.chunk_path(addr)
            SF.read_into(path, out)
            return path
        except FileNotFoundError:
            entry = self.packed(addr)
            if entry is None:
                raise
        if entry.length != len(out):
            raise SF.corrupt_file(
                entry.path,
                f"holds {entry.length} bytes for chunk {addr}, its metadata says {len(out)}",
            )
        entry.read(len(out), out)
        return entry.path

    def read_head(self, addr: str, n: int) -> tuple[bytes, str]:
        """The first (at most) `n` stored bytes of chunk `addr` and their file."""
        try:
            path = self.chunk_path(addr)
            fd = SF.open_regular(path)
            try:
                return os.read(fd, n), path
            finally:
                os.close(fd)
        except FileNotFoundError:
            entry = self.packed(addr)
            if entry is None:
                raise
        data = entry.read(entry.length)
        return bytes(data[:n]), entry.path

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
        if addr in self._where or os.path.lexists(final):
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
                if not self._unpack(addr):
                    raise StorageError(
                        f"chunk {addr} is missing from {self.repo.path}/chunks (it was to "
                        "be written by an earlier commit of this process that failed)"
                    ) from None
                self.link(addr, dst)
                return
            except OSError as err:
                if err.errno not in LINK_UNSUPPORTED:
                    raise
                if err.errno != errno.EMLINK:  # too many links to this one file: copy just it
                    self._links = False
        if not os.path.lexists(src) and not self._unpack(addr):
            raise StorageError(f"chunk {addr} is missing from {self.repo.path}")
        shutil.copyfile(src, dst, follow_symlinks=False)

    def _unpack(self, addr: str) -> bool:
        """Store chunk `addr`, held in a pack, as a loose file too (a version
        with a zarr view links it); ``False`` when no pack holds it."""
        entry = self.packed(addr)
        if entry is None:
            return False
        blob = entry.read(entry.length)
        repo = self.repo
        SF.make_dir(repo.p(F.CHUNKS, addr[:2]))
        self._dirs.add(addr[:2])
        tmp = repo.p(F.SCRATCH, f"c-{F.token()}")
        SF.write_file(tmp, blob, repo.durable, exclusive=True)
        try:
            try:
                os.link(tmp, repo.p(F.CHUNKS, addr[:2], addr[2:]))
            except FileExistsError:
                pass
            except OSError as err:
                if err.errno not in LINK_UNSUPPORTED:
                    raise
                os.replace(tmp, repo.p(F.CHUNKS, addr[:2], addr[2:]))
            if repo.durable:
                SF.fsync_dir(repo.p(F.CHUNKS, addr[:2]))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True
