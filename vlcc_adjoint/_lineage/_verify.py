"""Verifying a repository: every byte a read depends on, read and checked now (``vlcc verify``).

Damage is otherwise found only when a version is read (``checkout``,
``diff``); :func:`verify` looks for it everywhere at once, like
``git fsck``, and says which versions each damaged file breaks.  It is a
read of everything through the repository's own checked read paths, not a
second reader:

1. the root ``zarr.json`` (sealed; :meth:`~._repo.Repository.root_attrs`)
   and the graph file (sealed; :meth:`~._repo.Repository.read_graph`), read
   from disk now, whatever was cached when the repository was opened;
2. every version the graph lists: its manifest (sealed, and matching the
   digest the graph records; :meth:`~._read.Reader.manifest`) and every
   chunk of every leaf (:meth:`~._read.Reader.read_chunk`: size, decoding
   bounds, and the xxh3-128 of the decoded bytes against the address),
   delta chunks resolved down their chain of bases, each base checked; each
   distinct chunk is read once, through a :class:`~._read.Reader` with
   nothing cached (:meth:`~._chunks.ChunkStore.uncached`); a chunk held in
   a pack (:mod:`._packs`) is read through the pack's index (checked) and
   checked against the index's digest too, and every pack in ``packs/`` has
   its index read and checked, referenced or not;
3. what plain zarr reads of a version (``zarr.open_group`` on
   ``versions/<id>``, which the module docstring of
   :mod:`vlcc_adjoint.lineage` promises works): each leaf's array
   ``zarr.json`` must be the document its manifest entry gives
   (:func:`._format.array_meta`; equal as JSON), and each chunk key file must be the chunk
   file itself (a hard link) or a byte-identical copy.  A packed version has
   no zarr view (its manifest says ``"zarr_view": false``); none is checked.

A damaged file is reported once, with the first problem met and every
version it breaks: a chunk shared by many versions (deduplication) or a
delta base breaks every version that reads through it; the root or the graph
breaks them all.  Nothing is written, removed or repaired: the remedy (check
out another version, ``gc`` the broken ones away, restore from a copy) is
the user's.  Export and import verify what they copy with it
(:mod:`._transfer`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable

from ..errors import VlccKeyError
from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _format as F
from ._format import Manifest
from ._graph import Graph, human_bytes
from ._read import Reader, compressed_bound

__all__ = ["Damage", "Verification", "check_intact", "verify"]

#: How a report names "every version" (the root or the graph is damaged).
EVERY = "*"


@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged (or missing) file of a repository.

    **Attributes:** `path` (the file), `problem` (what is wrong: the first
    check it failed), `versions` (the ids of the versions it breaks, sorted;
    ``("*",)``: every version, for the root or the graph).
    """

    path: str
    problem: str
    versions: tuple[str, ...]

    def __str__(self) -> str:
        if self.versions == (EVERY,):
            broken = "breaks every version"
        elif self.versions:
            n = len(self.versions)
            broken = f"breaks {n} version{'s' * (n != 1)}: {', '.join(self.versions)}"
        else:
            broken = "breaks no version"
        return f"{self.path}: {broken} ({self.problem})"


@dataclasses.dataclass(frozen=True)
class Verification:
    """What :meth:`History.verify <vlcc_adjoint.lineage.History.verify>` found.

    Truthy when nothing is damaged.

    **Attributes:** `path` (the repository), `versions` (versions checked),
    `chunks` (distinct chunk files read, delta bases included), `nbytes`
    (bytes of chunk files read), `damaged` (one :class:`Damage` per damaged
    file, in path order).
    """

    path: str
    versions: int
    chunks: int
    nbytes: int
    damaged: tuple[Damage, ...]

    @property
    def ok(self) -> bool:
        """Whether every byte a read depends on is intact."""
        return not self.damaged

    def __bool__(self) -> bool:
        return self.ok

    @property
    def broken(self) -> set[str]:
        """The ids of the versions some damaged file breaks (``{"*"}``: all)."""
        return {v for d in self.damaged for v in d.versions}

    def summary(self) -> str:
        """One line: what was checked, and what is damaged."""
        checked = (
            f"{self.versions} version{'s' * (self.versions != 1)}, {self.chunks} chunk "
            f"file{'s' * (self.chunks != 1)} ({human_bytes(self.nbytes)})"
        )
        if self.ok:
            return f"verified {self.path}: {checked}, no damage"
        broken = self.broken
        which = "every version" if EVERY in broken else f"{len(broken)} of {self.versions} versions"
        n = len(self.damaged)
        return (
            f"{self.path} is damaged: {n} damaged file{'s' * (n != 1)} break"
            f"{'s' * (n == 1)} {which} "
            f"(checked {checked}); check out an intact version, or restore the repository "
            "from a copy"
        )

    def __str__(self) -> str:
        return "\n".join([*(f"damaged: {d}" for d in self.damaged), self.summary()])


class _Findings:
    """The damaged files met so far, with the versions each breaks."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, set[str]]] = {}

    def add(self, path: str, problem: str, versions: Iterable[str]) -> None:
        self.files.setdefault(path, (problem, set()))[1].update(versions)

    def report(self, path: str, versions: int, chunks: int, nbytes: int) -> Verification:
        damaged = tuple(
            Damage(p, problem, (EVERY,) if EVERY in vids else tuple(sorted(vids)))
            for p, (problem, vids) in sorted(self.files.items())
        )
        return Verification(path, versions, chunks, nbytes, damaged)


#: The parts of a read error's message that name the version and the remedy:
#: a report names the versions itself, and says what to do once.
_PREFIX = re.compile(r"^version [0-9a-f]+ of the history at .*? is corrupt: ")
_REMEDY = re.compile(
    r"(\. The stored data was damaged.*|; check out another version.*|; restore it from a copy.*)$"
)


def _problem(err: BaseException, root: str) -> str:
    """What `err` says is wrong, on one line, with paths relative to `root`."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = _REMEDY.sub("", _PREFIX.sub("", text))
    return text.replace(root + os.sep, "")


def verify(reader: Reader, graph: Graph | None = None) -> Verification:
    """Read and check every byte of the repository of `reader` that a read
    depends on (see the module docstring).

    **Arguments:**

    - `reader`: the repository's :class:`~._read.Reader` (its caches are not
      used: a reader with nothing cached reads everything from disk).
    - `graph`: the versions to check (an export's snapshot); ``None``: the
      graph file read now (when it is damaged, the versions of the graph
      read when the repository was last refreshed are checked).

    **Returns:** a :class:`Verification`.  Raises only for I/O failures
    (:class:`~vlcc_adjoint.storage.StorageError`), never for damage.
    """
    repo = reader.repo
    found = _Findings()
    try:
        repo.root_attrs()
    except CorruptCheckpointError as err:
        found.add(err.path or repo.p("zarr.json"), _problem(err, repo.path), [EVERY])
    if graph is None:
        try:
            graph = repo.read_graph()
        except CorruptCheckpointError as err:
            found.add(err.path or repo.graph_path(), _problem(err, repo.path), [EVERY])
            graph = repo.graph
    fresh = Reader(repo, reader.chunks.uncached())
    chunk_state: dict[str, tuple[str, str] | None] = {}  # address -> (damaged file, problem)
    nbytes = 0
    ids = sorted(graph.nodes, key=lambda v: graph.nodes[v]["seq"])
    with fresh.reading():
        for vid in ids:
            try:
                m = fresh.manifest(vid)
            except VlccKeyError:
                continue  # removed by gc since the graph was read
            except CorruptCheckpointError as err:
                found.add(
                    err.path or repo.p(F.VERSIONS, vid, "zarr.json"),
                    _problem(err, repo.path),
                    [vid],
                )
                continue
            nbytes += _check_chunks(fresh, m, chunk_state, found)
            _check_zarr_view(fresh, m, found)
        fresh.chunks.scan_packs()
        for name, damage in fresh.chunks.pack_damage.items():
            found.add(damage.path or repo.p(F.PACKS, name), _problem(damage, repo.path), [])
    return found.report(repo.path, len(ids), len(chunk_state), nbytes)


def _check_chunks(
    reader: Reader,
    m: Manifest,
    chunk_state: dict[str, tuple[str, str] | None],
    found: _Findings,
) -> int:
    """Read every chunk of version `m` not read yet (into `chunk_state`),
    adding the damaged ones to `found`; return the bytes read."""
    nbytes = 0
    for i, (layout, cfg, addrs) in enumerate(m.leaves):
        where = f"leaf #{i} ({layout.dtype.str}{list(layout.shape)})"
        for j, addr in enumerate(addrs):
            if addr not in chunk_state:
                path = reader.repo.p(F.chunk_relpath(addr))
                try:
                    reader.read_chunk(m, where, j, addr, layout, cfg, None)
                    chunk_state[addr] = None
                    nbytes += reader.chunks.stored_size(addr)
                except CorruptCheckpointError as err:
                    chunk_state[addr] = (err.path or path, _problem(err, reader.repo.path))
            state = chunk_state[addr]
            if state is not None:
                found.add(state[0], state[1], [m.id])
    return nbytes


def _check_zarr_view(reader: Reader, m: Manifest, found: _Findings) -> None:
    """The files plain zarr reads of version `m`: each leaf's array metadata
    and chunk key files (see the module docstring)."""
    repo = reader.repo
    if not m.zarr_view and not os.path.lexists(repo.p(F.VERSIONS, m.id, "0")):
        return  # a packed version: no zarr view (an imported copy has one: checked)
    for i, (layout, cfg, addrs) in enumerate(m.leaves):
        leaf_dir = repo.p(F.VERSIONS, m.id, str(i))
        meta = os.path.join(leaf_dir, "zarr.json")
        expected = F.array_meta(layout, cfg)
        try:
            SF.check_dir(leaf_dir)
            raw = SF.read_limited(meta, SF.MAX_METADATA_BYTES)
            # The same document; the manifest's codec configuration comes back
            # with its keys sorted, so the bytes may differ in key order only.
            if raw != expected and SF.parse_json(raw, meta) != SF.parse_json(expected, meta):
                found.add(
                    meta,
                    f"the zarr array metadata of leaf #{i} differs from what the version's "
                    "manifest gives (plain zarr would read the leaf wrong)",
                    [m.id],
                )
        except FileNotFoundError as err:
            found.add(err.filename or meta, f"leaf #{i}'s zarr array is missing", [m.id])
            continue
        except CorruptCheckpointError as err:
            found.add(err.path or meta, _problem(err, repo.path), [m.id])
            continue
        except OSError as err:
            raise StorageError(f"reading {meta} of version {m.id} failed: {err}") from err
        n = layout.chunk_nbytes
        for j, ((_, _, key), addr) in enumerate(zip(layout.spans(), addrs)):
            linked = os.path.join(leaf_dir, key)
            chunk = repo.p(F.chunk_relpath(addr))
            try:
                st = os.lstat(linked)
                try:
                    src = os.lstat(chunk)
                except FileNotFoundError:
                    continue  # reported as the chunk's own damage
                if (st.st_dev, st.st_ino) == (src.st_dev, src.st_ino):
                    continue  # the chunk file itself, verified above
                bound = compressed_bound(n)
                if SF.read_limited(linked, bound) != SF.read_limited(chunk, bound):
                    found.add(
                        linked,
                        f"chunk {j} of leaf #{i} as plain zarr reads it differs from the "
                        f"chunk file {F.chunk_relpath(addr)}",
                        [m.id],
                    )
            except FileNotFoundError:
                found.add(linked, f"chunk {j} of leaf #{i} is missing from its zarr array", [m.id])
            except CorruptCheckpointError as err:
                found.add(err.path or linked, _problem(err, repo.path), [m.id])
            except OSError as err:
                raise StorageError(f"reading {linked} of version {m.id} failed: {err}") from err


def check_intact(report: Verification, what: str, archive: str | None = None) -> None:
    """Raise :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming every
    damaged file of `report` unless it is intact.

    **Arguments:** `report`, a :meth:`verify` result; `what`, the operation
    refused ("exporting run.vlcc"...); `archive`: the files came from this
    archive (an import), and are named as its members.
    """
    if report.ok:
        return

    def name(path: str) -> str:
        if archive is None:
            return path
        return f"{os.path.relpath(path, report.path)} (in {archive})"

    files = "; ".join(
        str(Damage(name(d.path), d.problem.replace(report.path + os.sep, ""), d.versions))
        for d in report.damaged
    )
    n = len(report.damaged)
    raise CorruptCheckpointError(
        f"{what} refused: {n} damaged file{'s' * (n != 1)}: {files}; "
        + (
            "export the history again from an intact copy"
            if archive is not None
            else "check the repository with `vlcc verify`, gc the broken versions away or "
            "restore it from a copy"
        ),
        tier=f"lineage:{report.path}",
        path=name(report.damaged[0].path),
    )
