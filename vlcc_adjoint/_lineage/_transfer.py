"""Moving a repository: the archives of ``export_history`` / ``import_history``.

:func:`write_archive` archives an open repository and :func:`unpack_archive`
checks and extracts one; ``History.export``, ``export_history`` and
``import_history`` (``vlcc export``/``import``, :mod:`._history`) open the
repositories around them.

An export is a tar file (``.tar.gz``/``.tgz``: compressed) of a consistent
snapshot: the graph is read once, and only the versions it lists and the
chunks they use are archived, chunks first, so that every version's chunk
files become tar *hard links* to them (the archive holds each chunk once, and
extraction recreates the links).  A chunk held in a pack (:mod:`._packs`) is
archived as a loose chunk file, and a packed version gets its zarr view in
the archive (each leaf's array ``zarr.json`` and its chunk keys as hard links
to those files): an imported copy has no packs and reads as plain zarr.  ``locks/`` and ``scratch/`` are not
archived; opening the imported repository recreates them.  Import checks the
archive before extracting it: only the repository's own top-level names,
regular files, directories and hard links, through tarfile's ``data`` filter
(no absolute paths, no ``..``, no devices, no links leaving the directory).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time

from ..storage import StorageError
from ..storage import format as SF
from . import _format as F
from ._graph import Graph, graph_file
from ._read import Reader, compressed_bound
from ._verify import check_intact, verify

__all__ = ["check_import_target", "discard_import", "unpack_archive", "write_archive"]

_TOP = {"zarr.json", F.CHUNKS, F.VERSIONS, F.GRAPH, F.LOCKS, F.SCRATCH}


def write_archive(reader: Reader, g: Graph, out: str, force: bool = False) -> None:
    """Archive the repository of `reader` as of graph `g` into the tar file `out`
    (``.tar.gz``/``.tgz``: compressed): only the versions `g` lists and the
    chunks they use (delta bases included), chunks first.

    What is archived is verified first (:func:`._verify.verify` of the
    versions of `g`): a damaged repository is refused with
    :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming every
    damaged file, and no archive is written.  An existing `out` is replaced
    only with `force` (else :class:`~vlcc_adjoint.storage.StorageError`);
    the archive is written beside it and renamed into place when complete,
    so a failed export leaves no partial archive and the old file intact.
    """
    _check_target(out, force)
    with reader.reading():
        check_intact(verify(reader, g), f"exporting {reader.repo.path}")
        work = f"{out}.{F.token()}.partial"
        try:
            if out.endswith((".tar.gz", ".tgz")):
                tar = tarfile.open(work, "x:gz")
            else:
                tar = tarfile.open(work, "x")
            with tar:
                _archive(reader, g, tar)
            _check_target(out, force)  # created meanwhile by someone else
            os.replace(work, out)
        finally:
            if os.path.lexists(work):  # no partial archive is left behind
                os.unlink(work)


def _check_target(out: str, force: bool) -> None:
    """Refuse to replace an existing `out` unless `force` (and never a directory)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise StorageError(f"{out} is a directory; give the path of the archive file to write")
    if not force:
        raise StorageError(
            f"{out} exists; give another path, or replace it with --force "
            "(History.export(out, force=True))"
        )


def _archive(reader: Reader, g: Graph, tar: tarfile.TarFile) -> None:
    """Write the repository of `reader` at graph `g` into the open tar file `tar`."""
    repo = reader.repo
    for name in ("zarr.json", f"{F.CHUNKS}/zarr.json", f"{F.VERSIONS}/zarr.json"):
        _check_regular(repo.p(name), directory=False)
        tar.add(repo.p(name), arcname=name)
    data = graph_file(g)
    info = tarfile.TarInfo(f"{F.GRAPH}/zarr.json")
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))
    ids = sorted(g.nodes, key=lambda v: g.nodes[v]["seq"])
    addrs: set[str] = set()
    biggest = 0
    for vid in ids:
        m = reader.manifest(vid)
        addrs |= m.addresses()
        biggest = max([biggest, *(layout.chunk_nbytes for layout, _, _ in m.leaves)])
    addrs = reader.chunks.closure(addrs)  # with the bases of delta chunks
    for addr in sorted(addrs):  # chunks first: version files then become tar hard links
        rel = F.chunk_relpath(addr)
        if os.path.lexists(repo.p(rel)):
            _check_regular(repo.p(rel), directory=False)
            tar.add(repo.p(rel), arcname=rel)
        else:  # in a pack: archived as a loose chunk file (verified above)
            blob, _ = reader.chunks.read_blob(addr, compressed_bound(biggest))
            _add_bytes(tar, rel, blob)
    for vid in ids:
        _check_regular(repo.p(F.VERSIONS, vid), directory=True)
        tar.add(repo.p(F.VERSIONS, vid), arcname=f"{F.VERSIONS}/{vid}")
        m = reader.manifest(vid)
        if m.zarr_view or os.path.lexists(repo.p(F.VERSIONS, vid, "0")):
            continue
        # A packed version: its zarr view is added, so the copy is plain zarr again.
        for i, (layout, cfg, leaf_addrs) in enumerate(m.leaves):
            leaf = f"{F.VERSIONS}/{vid}/{i}"
            _add_bytes(tar, f"{leaf}/zarr.json", F.array_meta(layout, cfg))
            for (_, _, key), addr in zip(layout.spans(), leaf_addrs):
                info = tarfile.TarInfo(f"{leaf}/{key}")
                info.type, info.linkname = tarfile.LNKTYPE, F.chunk_relpath(addr)
                info.mtime, info.mode = int(time.time()), 0o644
                tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a regular file `name` holding `data` to the archive `tar`."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def _check_regular(path: str, directory: bool) -> None:
    """`path` is a regular file (or a real directory holding only such files and
    directories): an archive never carries a link, a FIFO or a device out of a repository."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SF.corrupt_file(path, "is missing: the repository is damaged") from None
    ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not ok:
        raise SF.corrupt_file(
            path,
            "is not a regular "
            + ("directory" if directory else "file")
            + " (a link or a special file): the repository was tampered with",
        )
    if directory:
        for entry in os.scandir(path):
            _check_regular(entry.path, entry.is_dir(follow_symlinks=False))


def check_import_target(path: str) -> bool:
    """Refuse an import into `path` unless it is new or an empty directory;
    return whether it exists."""
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path) or os.listdir(path):
            raise StorageError(
                f"{path} exists and is not an empty directory; import into a new path"
            )
        return True
    return False


def discard_import(path: str, existed: bool) -> None:
    """Remove what a failed import put into `path` (the directory too, unless it
    `existed` before, empty): nothing half-imported stays."""
    if not existed:
        SF.remove_tree(path, os.path.dirname(path))
        return
    for entry in os.scandir(path):
        SF.remove_tree(entry.path, path)


def unpack_archive(archive: str | os.PathLike, path: str) -> None:
    """Extract an archive made by :func:`write_archive` into the new directory `path`.

    The archive is checked first: only the repository's own top-level names,
    regular files, directories and hard links inside it (tarfile's ``data``
    filter: no absolute paths, ``..``, devices or links leaving the
    directory).  The caller opens the result to validate it.
    """
    check_import_target(path)
    archive = os.fspath(archive)
    try:
        tar = tarfile.open(archive, "r:*")
    except FileNotFoundError:
        raise StorageError(
            f"no archive {archive}; give the path of a file made by `vlcc export`"
        ) from None
    except IsADirectoryError:
        raise StorageError(
            f"{archive} is a directory, not an archive; give the file made by `vlcc export`"
        ) from None
    except tarfile.TarError:
        raise StorageError(
            f"{archive} is not a history archive (not a tar file, plain or "
            "compressed); make archives with `vlcc export` or History.export"
        ) from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as err:
            raise StorageError(
                f"{archive} is not a readable history archive ({err}); make "
                "archives with `vlcc export` or History.export"
            ) from None
        for m in members:
            top = m.name.split("/", 1)[0]
            if top not in _TOP or not (m.isfile() or m.isdir() or m.islnk()):
                raise StorageError(
                    f"{archive} is not a history archive (member {m.name!r}); "
                    "make archives with `vlcc export` or History.export"
                )
        if "zarr.json" not in {m.name for m in members}:
            raise StorageError(f"{archive} has no zarr.json: not a history archive")
        os.makedirs(path, exist_ok=True)
        tar.extractall(path, members=members, filter="data")
