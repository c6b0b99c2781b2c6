"""The lineage commands of ``vlcc``: log, show, diff, gc, inspect, verify, export, import.

:func:`add_commands` declares their arguments on ``vlcc_adjoint.cli``'s
parser, which calls these functions; each returns the process exit status
(0 ok, 1 ``diff --exit-code`` found a difference or ``verify`` found damage,
2 an error, printed as one line naming the remedy).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from collections.abc import Callable
from typing import Any

from ..errors import VlccValueError
from ..storage import StorageError
from ..storage import format as SF
from . import _format as F
from ._graph import human_bytes


def _fail(err: BaseException) -> int:
    text = err.args[0] if isinstance(err, KeyError) and err.args else err
    if isinstance(err, OSError) and err.filename is not None:
        text = f"{err.filename}: {err.strerror or err}"
    text = "; ".join(line.strip() for line in str(text).splitlines() if line.strip())
    print(f"vlcc: error: {text}", file=sys.stderr)
    return 2


def _open(path: str, mode: str = "r"):
    from ._history import History

    if mode != "r" and not os.path.lexists(os.path.join(path, "zarr.json")):
        # A command never creates a repository where it was told one is.
        raise StorageError(
            f"no lineage history at {path}; check the path (`vlcc inspect "
            f"{path}` says what is there)"
        )
    return History(path, mode=mode)


def _guard(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except (
            StorageError,
            KeyError,
            ValueError,
            TypeError,
            OSError,
            tarfile.TarError,
            EOFError,
        ) as err:
            return _fail(err)

    return run


@_guard
def log(args) -> int:
    with _open(args.path) as h:
        if args.branch:
            from ._graph import render

            versions = h.log(args.branch, limit=args.n)
            refs: dict[str, list[str]] = {}
            for name, vid in h.branches.items():
                refs.setdefault(vid, []).append(name)
            for name, vid in h.tags.items():
                refs.setdefault(vid, []).append(f"tag: {name}")
            lines = render(
                versions,
                lambda v: (
                    f"{v.id}"
                    + (f" ({', '.join(refs[v.id])})" if v.id in refs else "")
                    + (f" {v.message}" if v.message else "")
                ),
            )
            text = "\n".join(lines)
        else:
            text = h.draw(limit=args.n)
        print(text if text else f"(no versions yet in {h.path})")
    return 0


@_guard
def show(args) -> int:
    with _open(args.path) as h:
        v = h.version(args.version)
        refs = [
            f"{'HEAD -> ' if name == h.head else ''}{name}"
            for name, vid in sorted(h.branches.items())
            if vid == v.id
        ]
        refs += [f"tag: {t}" for t in v.tags]
        print(f"version  {v.id}" + (f"  ({', '.join(refs)})" if refs else ""))
        print(f"branch   {v.branch}")
        print(f"parents  {' '.join(v.parents) if v.parents else '(none: a root)'}")
        print(f"created  {v.time.isoformat(timespec='seconds')}")
        if v.message:
            print(f"message  {v.message}")
        if v.meta:
            print(f"meta     {json.dumps(v.meta)}")
        leaves = h.leaves(v.id)
        print(
            f"state    {len(leaves)} arrays, {human_bytes(v.nbytes)}; this version added "
            f"{human_bytes(v.new_bytes)} of new chunks"
        )
        rows = [("leaf", "dtype", "shape", "bytes", "chunks", "zarr array")]
        for leaf in leaves:
            rows.append(
                (
                    leaf.path,
                    leaf.dtype,
                    str(list(leaf.shape)),
                    human_bytes(leaf.nbytes),
                    str(leaf.chunks),
                    leaf.array,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


@_guard
def diff(args) -> int:
    with _open(args.path) as h:
        if args.rtol or args.atol:
            c = h.compare(args.a, args.b, rtol=args.rtol, atol=args.atol)
            print(c.diff.table())
            verdict = "equal" if c.equal else "NOT equal"
            print(
                f"{verdict} within rtol={args.rtol:g}, atol={args.atol:g}"
                + ("" if c.equal else f": {c.reason}")
            )
            changed = not c.equal
        else:
            d = h.diff(args.a, args.b)
            print(d.table())
            changed = d.changed
    return 1 if (changed and args.exit_code) else 0


@_guard
def gc(args) -> int:
    from ._gc import KeepPolicy

    policy = None
    if args.keep_last is not None or args.keep_best or args.keep:
        best = None
        if args.keep_best:
            key, _, mode = args.keep_best.rpartition(":")
            if not key or mode not in ("min", "max"):
                raise VlccValueError(
                    f"--keep-best takes KEY:min or KEY:max, got {args.keep_best!r}"
                )
            best = (key, mode)
        policy = KeepPolicy(
            last=args.keep_last,
            tagged=not args.no_keep_tagged,
            best=best,
            keep=tuple(args.keep or ()),
        )
    with _open(args.path, "a") as h:
        print(h.gc(keep=policy, dry_run=args.dry_run))
    return 0


@_guard
def export(args) -> int:
    from ._history import export_history

    out = export_history(args.path, args.out, force=args.force)
    print(f"exported {args.path} to {out} ({human_bytes(os.path.getsize(out))})")
    return 0


@_guard
def import_(args) -> int:
    from ._history import import_history

    path = import_history(args.archive, args.path)
    with _open(path) as h:
        print(
            f"imported {args.archive} into {path}: {len(h)} versions, branches "
            f"{', '.join(sorted(h.branches)) or '(none)'}"
        )
    return 0


@_guard
def inspect(args) -> int:
    path = args.path
    try:
        if SF.open_group(os.path.join(path, "zarr.json"), F.ROOT_KEY) is None:
            raise StorageError(f"{path} has no lineage root")
    except (OSError, StorageError):
        if not os.path.isdir(os.path.join(path, F.GRAPH)):
            return _inspect_other(path)
        # A history whose root is damaged: opening it says what and where.
    with _open(path) as h:
        u = h.usage()
        print(f"lineage history {h.path}")
        print(
            f"  versions  {u.versions}   branches {u.branches}   tags {u.tags}   HEAD -> {h.head}"
        )
        for name, vid in sorted(h.branches.items()):
            v = h.version(vid)
            print(
                f"  branch {name:<16} {vid}  {len(h.log(name))} versions, last "
                f"{v.time.isoformat(timespec='seconds')}  {v.message}"
            )
        for name, vid in sorted(h.tags.items()):
            print(f"  tag    {name:<16} {vid}")
        print(f"  chunks    {u.chunks} files, {human_bytes(u.chunk_bytes)}")
        print(
            f"  on disk   {human_bytes(u.disk_bytes)} for {human_bytes(u.logical_bytes)} of "
            f"versions (deduplication x{u.dedup_ratio:.2f})"
        )
    return 0


def verify(args) -> int:
    """``vlcc verify PATH``: every damaged file of a history or a ZarrTier store,
    one line each with what it breaks, then a one-line summary; exit 1 if any."""
    from ..storage import CorruptCheckpointError

    path = args.path
    history = _is_history(path)
    try:
        if not history and not os.path.lexists(os.path.join(path, "zarr.json")):
            raise StorageError(
                f"{path} is neither a lineage history nor a ZarrTier store (no zarr.json); "
                "check the path"
            )
        if history:
            return _verify_history(path)
        return _verify_store(path)
    except CorruptCheckpointError as err:
        # What opening reads first (the root, the graph, the top-level
        # directories): nothing else is readable without it.
        what = "version" if history else "record"
        where = err.path or os.path.join(path, "zarr.json")
        print(f"damaged: {where}: breaks every {what} ({_one_line(err)})")
        print(
            f"{path} is damaged: {where} breaks every {what}; restore it from a copy "
            "(the other files are checked once it reads)"
        )
        return 1
    except (StorageError, ValueError, TypeError, OSError) as err:
        return _fail(err)


def _is_history(path: str) -> bool:
    """Whether `path` holds a history (else a ZarrTier store, or nothing), by its
    root, or by its layout when the root does not read."""
    from ..storage import CorruptCheckpointError

    root = os.path.join(path, "zarr.json")
    try:
        if SF.open_group(root, F.ROOT_KEY) is not None:
            return True
        if SF.open_group(root, "vlcc_adjoint") is not None:
            return False
    except (CorruptCheckpointError, OSError):
        pass
    return all(os.path.isdir(os.path.join(path, d)) for d in (F.GRAPH, F.CHUNKS, F.VERSIONS))


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


def _verify_history(path: str) -> int:
    with _open(path) as h:
        report = h.verify()
    print(report)
    return 0 if report.ok else 1


def _verify_store(path: str) -> int:
    from ..storage import ZarrTier

    with ZarrTier(path, mode="r") as tier:
        errors = tier.verify()
        records = len(tier)
        nbytes = tier.used_bytes
    by_file: dict[str, tuple[str, set[str]]] = {}
    for err in errors:
        entry = by_file.setdefault(err.path or path, (_one_line(err), set()))
        if err.key is not None:
            entry[1].add(err.key)
    broken: set[str] = set()
    for file, (problem, keys) in sorted(by_file.items()):
        broken |= keys
        which = ", ".join(sorted(keys)) if keys else "the store"
        print(f"damaged: {file}: breaks record{'s' * (len(keys) != 1)} {which} ({problem})")
    checked = f"{records} record{'s' * (records != 1)} ({human_bytes(nbytes)})"
    if not by_file:
        print(f"verified ZarrTier store {os.path.abspath(path)}: {checked}, no damage")
        return 0
    n = len(by_file)
    print(
        f"ZarrTier store {os.path.abspath(path)} is damaged: {n} damaged file"
        f"{'s' * (n != 1)} break{'s' * (n == 1)} {len(broken)} of {checked}; delete the "
        "broken records (or rerun the steps that wrote them)"
    )
    return 1


def _inspect_other(path: str) -> int:
    """Summarise a ZarrTier directory, read-only (opening a ZarrTier would clean its scratch)."""
    try:
        attrs = SF.open_group(os.path.join(path, "zarr.json"), "vlcc_adjoint")
        if attrs is None:
            raise StorageError(f"{path} has no vlcc_adjoint root")
    except (OSError, StorageError):
        raise StorageError(
            f"{path} is neither a lineage history nor a ZarrTier store (no "
            "vlcc zarr.json); check the path"
        ) from None
    records: list[tuple[str, Any, int | None, int | None]] = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            rec = SF.open_group(os.path.join(entry.path, "zarr.json"), "vlcc_adjoint")
            spec = rec.get("spec", {})
            nbytes = sum(int(leaf.get("nbytes", 0)) for leaf in rec.get("leaves", []))
            records.append((entry.name, spec.get("step"), len(rec.get("leaves", [])), nbytes))
        except (OSError, StorageError, ValueError, KeyError, TypeError, AttributeError):
            records.append((entry.name, None, None, None))
    total = sum(r[3] or 0 for r in records)
    print(f"ZarrTier store {os.path.abspath(path)} (format {attrs.get('format')})")
    print(f"  records   {len(records)}, {human_bytes(total)} of leaves")
    steps = sorted(r[1] for r in records if isinstance(r[1], int))
    if steps:
        print(f"  steps     {steps[0]} .. {steps[-1]}")
    for key, step, nleaves, size in records[:20]:
        if nleaves is None or size is None:
            print(f"  {key:<24} (unreadable metadata)")
        else:
            print(f"  {key:<24} step {step!s:<8} {nleaves} leaves  {human_bytes(size)}")
    if len(records) > 20:
        print(f"  ... {len(records) - 20} more")
    return 0


def add_commands(
    sub,
    integer: Callable[..., Callable[[str], int]],
    number: Callable[..., Callable[[str], float]],
) -> dict:
    """Declare the lineage subcommands on an argparse subparsers object.

    **Arguments:** `sub`, the subparsers; `integer`, `number`: the bounded
    option types of ``vlcc_adjoint.cli`` (``Integer``, ``Number``), passed
    in because that module imports this one.

    **Returns:** ``{command name: function(args) -> exit status}``.
    """
    p = sub.add_parser(
        "log",
        help="draw the version graph of a lineage history",
        description="Draw the versions of a History, newest first, with their "
        "branches (like git log --graph --oneline --all).",
    )
    p.add_argument("path", help="the history directory")
    p.add_argument("--branch", help="only this branch (or tag, version) and its ancestors")
    p.add_argument("-n", type=integer(1), default=None, metavar="N", help="at most N versions")

    p = sub.add_parser(
        "show",
        help="show one version of a lineage history",
        description="Show a version's metadata and its arrays.",
    )
    p.add_argument("path", help="the history directory")
    p.add_argument(
        "version",
        nargs="?",
        default="HEAD",
        help="branch, tag, version id (or prefix), REF~n (default HEAD)",
    )

    p = sub.add_parser(
        "diff",
        help="compare two versions leaf by leaf",
        description="Per leaf: changed or not, max absolute and relative "
        "difference.  With --rtol/--atol: a reproducibility check.",
    )
    p.add_argument("path", help="the history directory")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument(
        "--rtol", type=number(0.0), default=0.0, help="relative tolerance (>= 0, default 0)"
    )
    p.add_argument(
        "--atol", type=number(0.0), default=0.0, help="absolute tolerance (>= 0, default 0)"
    )
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit with status 1 when the versions differ (beyond tolerance)",
    )

    p = sub.add_parser(
        "gc",
        help="remove old versions and unreferenced chunks",
        description="Without options: keep every version, remove only chunks no "
        "version uses and leftovers of interrupted commits.  Branch tips and "
        "(unless --no-keep-tagged) tagged versions are always kept.",
    )
    p.add_argument("path", help="the history directory")
    p.add_argument(
        "--keep-last",
        type=integer(0),
        default=None,
        metavar="N",
        help="keep the last N versions of every branch",
    )
    p.add_argument(
        "--keep-best",
        metavar="KEY:min|max",
        help="keep the version with the smallest/largest meta[KEY]",
    )
    p.add_argument("--keep", action="append", metavar="REF", help="keep this version too")
    p.add_argument("--no-keep-tagged", action="store_true", help="tags do not protect versions")
    p.add_argument("--dry-run", action="store_true", help="only report what would be removed")

    p = sub.add_parser(
        "inspect",
        help="summarise a lineage history or a ZarrTier store",
        description="Versions, branches, tags and storage of a History; records "
        "and steps of a ZarrTier directory.  Reads only.",
    )
    p.add_argument("path")

    p = sub.add_parser(
        "export",
        help="archive a lineage history into a tar file",
        description="Write every version, the refs and the deduplicated chunks "
        "into one tar file (.tar.gz/.tgz: compressed), to move or suspend a run.  "
        "Everything archived is verified first (a damaged file is refused by name); "
        "an existing file is replaced only with --force.",
    )
    p.add_argument("path", help="the history directory")
    p.add_argument("out", help="the archive to write")
    p.add_argument("--force", action="store_true", help="replace an existing archive file")

    p = sub.add_parser(
        "verify",
        help="check every byte of a lineage history or a ZarrTier store",
        description="Like git fsck: read and check every file a read depends on "
        "(a history's root, graph, manifests, every chunk of every version with "
        "its delta bases; every record of a ZarrTier store), and name every "
        "damaged file with the versions (records) it breaks.  Exit status 0: "
        "intact, 1: damage found, 2: not a history or a store.  Reads only.",
    )
    p.add_argument("path", help="a history directory or a ZarrTier store")

    p = sub.add_parser(
        "import",
        help="unpack an exported history into a new directory",
        description="Recreate a history from `vlcc export`'s archive, verified (an "
        "archive with a damaged file is refused by name, and nothing of it stays).",
    )
    p.add_argument("archive")
    p.add_argument("path", help="a new (or empty) directory")

    return {
        "log": log,
        "show": show,
        "diff": diff,
        "gc": gc,
        "inspect": inspect,
        "verify": verify,
        "export": export,
        "import": import_,
    }
