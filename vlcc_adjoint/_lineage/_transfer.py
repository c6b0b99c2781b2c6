"""Moving a repository: ``export_history`` / ``import_history`` (``vlcc export``/``import``).

An export is a tar file (``.tar.gz``/``.tgz``: compressed) of a consistent
snapshot: the graph is read once, and only the versions it lists and the
chunks they use are archived, chunks first, so that every version's chunk
files become tar *hard links* to them (the archive holds each chunk once, and
extraction recreates the links).  ``locks/`` and ``scratch/`` are not
archived; opening the imported repository recreates them.  Import checks the
archive before extracting it: only the repository's own top-level names,
regular files, directories and hard links, through tarfile's ``data`` filter
(no absolute paths, no ``..``, no devices, no links leaving the directory).
"""

from __future__ import annotations

import io
import os
import tarfile
import time

from ..storage import StorageError
from . import _format as F

__all__ = ["export_history", "import_history"]

_TOP = {"zarr.json", F.CHUNKS, F.VERSIONS, F.GRAPH, F.LOCKS, F.SCRATCH}


def export_history(history, out) -> str:
    """Archive a repository (a :class:`History` or its path) into a tar file.

    A consistent snapshot: the graph is read once, and only the versions it
    lists and the chunks they use are archived (commits published meanwhile
    are not).  See :meth:`History.export`.
    """
    from ._history import History
    from ._repo import graph_file_text

    own = not isinstance(history, History)
    h = History(history, mode="r") if own else history
    out = os.fspath(out)
    try:
        g = h._sync()
        mode = "w:gz" if out.endswith((".tar.gz", ".tgz")) else "w"
        with h._gc_lock.shared(), tarfile.open(out, mode) as tar:
            for name in ("zarr.json", f"{F.CHUNKS}/zarr.json", f"{F.VERSIONS}/zarr.json"):
                tar.add(h._p(name), arcname=name)
            data = graph_file_text(g)
            info = tarfile.TarInfo(f"{F.GRAPH}/zarr.json")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
            ids = sorted(g.nodes, key=lambda v: g.nodes[v]["seq"])
            addrs: set[str] = set()
            for vid in ids:
                addrs |= h._manifest(vid).addresses()
            for addr in sorted(addrs):  # chunks first: version files then become tar hard links
                rel = F.chunk_relpath(addr)
                tar.add(h._p(rel), arcname=rel)
            for vid in ids:
                tar.add(h._p(F.VERSIONS, vid), arcname=f"{F.VERSIONS}/{vid}")
    finally:
        if own:
            h.close()
    return out


def import_history(archive, path) -> str:
    """Unpack an archive made by :func:`export_history` into a new repository at `path`.

    The archive is checked first: only the repository's own top-level names,
    regular files, directories and hard links inside it (tarfile's ``data``
    filter: no absolute paths, ``..``, devices or links leaving the
    directory).  **Returns:** `path`, a repository ``History(path)`` opens.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise StorageError(f"{path} exists and is not an empty directory; import into a new path")
    archive = os.fspath(archive)
    try:
        tar = tarfile.open(archive, "r:*")
    except FileNotFoundError:
        raise StorageError(f"no archive {archive}; give the path of a file made by `vlcc export`"
                           ) from None
    except IsADirectoryError:
        raise StorageError(f"{archive} is a directory, not an archive; give the file made by "
                           "`vlcc export`") from None
    except tarfile.TarError as err:
        raise StorageError(f"{archive} is not a history archive ({err}); make archives with "
                           "`vlcc export` or History.export") from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as err:
            raise StorageError(f"{archive} is not a readable history archive ({err}); make "
                               "archives with `vlcc export` or History.export") from None
        for m in members:
            top = m.name.split("/", 1)[0]
            if top not in _TOP or not (m.isfile() or m.isdir() or m.islnk()):
                raise StorageError(f"{archive} is not a history archive (member {m.name!r}); "
                                   "make archives with `vlcc export` or History.export")
        if "zarr.json" not in {m.name for m in members}:
            raise StorageError(f"{archive} has no zarr.json: not a history archive")
        os.makedirs(path, exist_ok=True)
        tar.extractall(path, members=members, filter="data")
    from ._history import History

    History(path, mode="a").close()  # validates, and adds the locks/ and scratch/ groups
    return path
