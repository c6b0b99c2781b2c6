"""The version graph: a networkx DiGraph, its JSON file, refs, and the ASCII drawing.

The graph lives in ``graph/zarr.json``, the attributes of a zarr group (so
plain zarr shows it as ``root["graph"].attrs["vlcc_lineage_graph"]``)::

    {"format": 2, "next_seq": 12, "head": "main",
     "branches": {"main": "9f0c1d2e3a4b", ...}, "tags": {"good": "...", ...},
     "graph": networkx.node_link_data(G, edges="edges")}

Nodes are version ids with attributes ``seq`` (publication order: a parent
is always published before its children, so ``seq`` is a topological
order), ``parents`` (ordered: the first parent is the branch's previous tip,
the others are merged versions), ``branch``, ``message``, ``meta``,
``created``, ``nbytes`` (the state's bytes), ``new_bytes`` (bytes of the
chunk files this version added when it was committed), ``digest`` (the
seal of its manifest; ``null`` for versions written in format 1); edges run
parent -> child.  The file is rebuilt into a ``networkx.DiGraph`` on open
and after every change by another process; it is validated (ids, parents,
refs, acyclicity) and never executed.

The graph file is sealed (:func:`graph_file`) by the digest of the
bytes of its JSON text as written
(:func:`vlcc_adjoint.storage.format.sealed_text_group`), not of a canonical
re-encoding: a commit to a long history assembles the text from cached
fragments (:meth:`Graph.dumps`), and re-encoding thousands of versions on
every publication is what the fragments avoid.  The graph's format number
sits inside the hashed text and each node repeats its manifest's digest, so
a sealed graph cannot pass for a format 1 one (which has no seal), nor a
manifest be swapped for another well-sealed one, by a changed byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable

import networkx as nx

from ..errors import VlccValueError
from ..storage import format as SF
from ._format import GRAPH_KEY, VERSION_ID

GRAPH_FORMAT = 2  # 2: sealed (graph_file), nodes carry their manifest's digest
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,99}")
_NODE_KEYS = (
    "seq",
    "parents",
    "branch",
    "message",
    "meta",
    "created",
    "nbytes",
    "new_bytes",
    "digest",
)
_DIGEST = re.compile(r"[0-9a-f]{32}")


def check_name(name: str, what: str) -> str:
    """A branch or tag name, validated (``ValueError`` saying what is allowed)."""
    if (
        not isinstance(name, str)
        or _NAME.fullmatch(name) is None
        or ".." in name
        or name.endswith(("/", "."))
        or name == "HEAD"
    ):
        raise VlccValueError(
            f"invalid {what} name {name!r}: use 1-100 characters of A-Z a-z 0-9 _ . - /, "
            "starting with a letter, digit or '_', without '..' or '~', not 'HEAD'"
        )
    return name


@dataclasses.dataclass(frozen=True, eq=False)
class Version:
    """One version of a :class:`~vlcc_adjoint.lineage.History` (what ``log`` lists).

    **Attributes:**

    - `id`: the version id (12 hexadecimal characters).
    - `message`: the commit message.
    - `meta`: the free-form JSON metadata given to ``commit`` (step, loss, ...).
    - `parents`: parent ids, first parent first (two or more: a merge).
    - `branch`: the branch it was committed on.
    - `created`: when ``commit`` was called (seconds since the epoch; see `time`).
    - `tags`: the tags that point at it now.
    - `seq`: its publication number in the repository (newer is larger).
    - `nbytes`: bytes of the state's arrays.
    - `new_bytes`: bytes of chunk files this version added (the rest it shares).
    """

    id: str
    message: str
    meta: dict
    parents: tuple[str, ...]
    branch: str
    created: float
    tags: tuple[str, ...] = ()
    seq: int = 0
    nbytes: int = 0
    new_bytes: int = 0

    @property
    def time(self) -> datetime.datetime:
        """`created` as an aware local ``datetime``."""
        return datetime.datetime.fromtimestamp(self.created).astimezone()

    def __eq__(self, other) -> bool:
        return isinstance(other, Version) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        extra = f", tags={list(self.tags)}" if self.tags else ""
        return (
            f"Version({self.id!r}, branch={self.branch!r}, message={self.message!r}, "
            f"meta={self.meta!r}{extra})"
        )


class Graph:
    """The in-memory graph and refs of a repository.

    Versions are kept in a plain dict (``nodes``: id -> attributes); the
    ``networkx.DiGraph`` (``g``) is built from it on first use.  An installed
    Graph is never changed: writers change a :meth:`clone`.  Attribute dicts
    are shared between clones and never mutated (``remove`` replaces a
    version's dict when its parents change), so cloning costs a dict copy
    and serialising reuses each version's JSON text (``frags``, shared by
    every graph of one ``History``): a commit to a history of thousands of
    versions writes the graph file in milliseconds.
    """

    def __init__(self, frags: dict | None = None):
        self.nodes: dict[str, dict] = {}
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.head = "main"
        self.next_seq = 0
        self.frags: dict[tuple, str] = {} if frags is None else frags
        self._nx: nx.DiGraph | None = None
        # The JSON text of the first n versions (nodes, edges): publication only
        # appends, so a commit serialises one version, not all of them.
        self._text: tuple[int, str, str] = (0, "", "")

    def clone(self) -> Graph:
        other = Graph(self.frags)
        other.nodes = dict(self.nodes)
        other.branches = dict(self.branches)
        other.tags = dict(self.tags)
        other.head, other.next_seq = self.head, self.next_seq
        other._text = self._text
        return other

    @property
    def g(self) -> nx.DiGraph:
        """The DAG as networkx (edges parent -> child, the attributes on the nodes)."""
        if self._nx is None:
            g = nx.DiGraph()
            for vid, attrs in sorted(self.nodes.items(), key=lambda kv: kv[1]["seq"]):
                g.add_node(vid, **attrs)
                for p in attrs["parents"]:
                    g.add_edge(p, vid)
            self._nx = g
        return self._nx

    # -- JSON -----------------------------------------------------------------------

    def _fragment(self, vid: str, attrs: dict) -> str:
        key = (vid, tuple(attrs["parents"]))
        text = self.frags.get(key)
        if text is None:
            if len(self.frags) > 4 * len(self.nodes) + 1024:
                self.frags.clear()
            text = json.dumps({**attrs, "id": vid}, allow_nan=False, separators=(",", ":"))
            self.frags[key] = text
        return text

    def dumps(self) -> str:
        """The graph's JSON text: ``networkx.node_link_data(g, edges="edges")`` plus refs.

        ``nodes`` is in publication order (its insertion order: parsing keeps the
        file's order, which is that order, and ``add`` appends).
        """
        done, nodes, edges = self._text
        if done < len(self.nodes):
            new = list(itertools.islice(self.nodes.items(), done, None))
            more = ",".join(self._fragment(vid, attrs) for vid, attrs in new)
            more_edges = ",".join(
                f'{{"source":"{p}","target":"{vid}"}}'
                for vid, attrs in new
                for p in attrs["parents"]
            )
            nodes = f"{nodes},{more}" if nodes and more else nodes or more
            edges = f"{edges},{more_edges}" if edges and more_edges else edges or more_edges
            self._text = (len(self.nodes), nodes, edges)
        refs = json.dumps(
            {
                "format": GRAPH_FORMAT,
                "next_seq": self.next_seq,
                "head": self.head,
                "branches": dict(sorted(self.branches.items())),
                "tags": dict(sorted(self.tags.items())),
            },
            separators=(",", ":"),
        )
        return (
            refs[:-1]
            + ',"graph":{"directed":true,"multigraph":false,"graph":{},"nodes":['
            + nodes
            + '],"edges":['
            + edges
            + "]}}"
        )

    def to_json(self) -> dict:
        return json.loads(self.dumps())

    @classmethod
    def from_json(cls, doc, frags: dict | None = None) -> Graph:
        """Rebuild and validate (``ValueError`` on anything inconsistent).

        Acyclicity is checked through the publication order: every parent
        must have a smaller ``seq`` than its child, which no cycle can satisfy.
        """
        if not isinstance(doc, dict) or doc.get("format") not in (1, GRAPH_FORMAT):
            raise VlccValueError("unknown graph format")
        self = cls(frags)
        data = doc.get("graph")
        if not (
            isinstance(data, dict)
            and isinstance(data.get("nodes"), list)
            and isinstance(data.get("edges"), list)
        ):
            raise VlccValueError("no node-link graph")
        nodes = self.nodes
        last_seq = -1
        for node in data["nodes"]:
            if not (
                isinstance(node, dict)
                and isinstance(node.get("id"), str)
                and VERSION_ID.fullmatch(node["id"])
            ):
                raise VlccValueError(f"bad node {node!r:.80}")
            attrs = {k: node.get(k) for k in _NODE_KEYS}
            if not (
                type(attrs["seq"]) is int
                and isinstance(attrs["parents"], list)
                and isinstance(attrs["meta"], dict)
                and isinstance(attrs["created"], (int, float))
                and isinstance(attrs["branch"], str)
                and isinstance(attrs["message"], str)
                and type(attrs["nbytes"]) is int
                and type(attrs["new_bytes"]) is int
                and (
                    attrs["digest"] is None
                    or (isinstance(attrs["digest"], str) and _DIGEST.fullmatch(attrs["digest"]))
                )
            ):
                raise VlccValueError(f"bad attributes of version {node['id']}")
            if nodes and attrs["seq"] <= last_seq:
                raise VlccValueError("versions are not listed in publication order")
            last_seq = attrs["seq"]
            nodes[node["id"]] = attrs
        n_edges = 0
        for vid, attrs in nodes.items():
            for p in attrs["parents"]:
                parent = nodes.get(p) if isinstance(p, str) else None
                if parent is None:
                    raise VlccValueError(f"version {vid} has an unknown parent {p!r}")
                if parent["seq"] >= attrs["seq"]:
                    raise VlccValueError(
                        f"version {vid} is not newer than its parent {p} (a cycle?)"
                    )
            n_edges += len(attrs["parents"])
        edges = {(e.get("source"), e.get("target")) for e in data["edges"] if isinstance(e, dict)}
        if len(edges) != n_edges or any(
            t not in nodes or s not in nodes[t]["parents"] for s, t in edges
        ):
            raise VlccValueError("edges disagree with the parents of the versions")
        for kind in ("branches", "tags"):
            refs = doc.get(kind)
            if not isinstance(refs, dict):
                raise VlccValueError(f"bad {kind}")
            for name, vid in refs.items():
                check_name(name, kind[:-1] if kind == "tags" else "branch")
                if vid not in nodes:
                    raise VlccValueError(
                        f"{kind[:-1] if kind == 'tags' else 'branch'} {name!r} points "
                        f"at an unknown version {vid!r}"
                    )
            setattr(self, kind, dict(refs))
        head = doc.get("head")
        self.head = check_name(head, "branch") if isinstance(head, str) else "main"
        seq = doc.get("next_seq")
        if type(seq) is not int or any(a["seq"] >= seq for a in nodes.values()):
            raise VlccValueError("bad next_seq")
        self.next_seq = seq
        return self

    # -- queries --------------------------------------------------------------------

    def __contains__(self, vid) -> bool:
        return vid in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def version(self, vid: str) -> Version:
        a = self.nodes[vid]
        tags = tuple(sorted(t for t, v in self.tags.items() if v == vid))
        return Version(
            vid,
            a["message"],
            a["meta"],
            tuple(a["parents"]),
            a["branch"],
            float(a["created"]),
            tags,
            a["seq"],
            a["nbytes"],
            a["new_bytes"],
        )

    def newest_first(self, ids: Iterable[str]) -> list[Version]:
        return [
            self.version(v) for v in sorted(ids, key=lambda v: self.nodes[v]["seq"], reverse=True)
        ]

    def ancestors(self, vid: str) -> set[str]:
        """Every version `vid` descends from (not itself)."""
        seen: set[str] = set()
        stack = list(self.nodes[vid]["parents"])
        while stack:
            v = stack.pop()
            if v not in seen:
                seen.add(v)
                stack.extend(self.nodes[v]["parents"])
        return seen

    def first_parents(self, vid: str) -> list[str]:
        """`vid` and its first-parent ancestors, newest first."""
        out = []
        at: str | None = vid
        while at is not None:
            out.append(at)
            parents = self.nodes[at]["parents"]
            at = parents[0] if parents else None
        return out

    # -- changes (on a clone) ---------------------------------------------------------

    def add(
        self,
        vid: str,
        parents: list[str],
        branch: str,
        message: str,
        meta: dict,
        created: float,
        nbytes: int,
        new_bytes: int,
        digest: str | None = None,
    ) -> None:
        self.nodes[vid] = {
            "seq": self.next_seq,
            "parents": list(parents),
            "branch": branch,
            "message": message,
            "meta": meta,
            "created": created,
            "nbytes": int(nbytes),
            "new_bytes": int(new_bytes),
            "digest": digest,
        }
        self.next_seq += 1
        self._nx = None

    def remove(self, doomed: set[str]) -> None:
        """Remove versions, splicing them out: a kept version's parents become its
        nearest kept ancestors (in order, without duplicates)."""
        memo: dict[str, list[str]] = {}
        nodes = self.nodes
        for vid in sorted(nodes, key=lambda v: nodes[v]["seq"]):  # parents first
            out: list[str] = []
            for p in nodes[vid]["parents"]:
                for q in memo[p] if p in doomed else [p]:
                    if q not in out:
                        out.append(q)
            memo[vid] = out
        for vid in doomed:
            del nodes[vid]
        for vid, attrs in list(nodes.items()):
            if memo[vid] != attrs["parents"]:
                nodes[vid] = {**attrs, "parents": memo[vid]}
        self.tags = {t: v for t, v in self.tags.items() if v not in doomed}
        self._nx = None
        self._text = (0, "", "")


# -- the graph file -----------------------------------------------------------------------


def graph_file(g: Graph) -> bytes:
    """``graph/zarr.json`` holding the graph `g` (the JSON text of :meth:`Graph.dumps`), sealed."""
    return SF.sealed_text_group(GRAPH_KEY, g.dumps().encode("ascii"))


def parse_graph_file(raw: bytes, path: str) -> dict:
    """The graph document (``{"format": ..., "graph": ...}``) in the bytes of `path`.

    A sealed file (format 2) must carry the right digest; a file without a
    seal is accepted only as format 1.  ``CorruptCheckpointError`` naming
    `path` otherwise.
    """
    doc = SF.open_sealed_text_group(raw, GRAPH_KEY, path)
    if doc is not None:
        if not (isinstance(doc, dict) and doc.get("format") == GRAPH_FORMAT):
            raise SF.corrupt_file(path, "the sealed graph is not of format 2")
        return doc
    doc = SF.parse_json(raw, path)
    graph = SF.group_attribute(doc, GRAPH_KEY, path)
    if not isinstance(graph, dict):
        raise SF.corrupt_file(
            path,
            "is not the graph of a lineage history (a zarr v3 group with "
            f"{GRAPH_KEY!r} attributes)",
        )
    if graph.get("format") != 1 or len(doc["attributes"]) != 1:
        raise SF.corrupt_file(path, "the graph has no valid seal (only format 1 graphs have none)")
    return graph


# -- the ASCII graph -------------------------------------------------------------------


def _row(width: int, marks: dict[int, str]) -> str:
    chars = [" "] * width
    for pos, ch in marks.items():
        if 0 <= pos < width:
            chars[pos] = ch
    return "".join(chars).rstrip()


def render(versions: list[Version], describe: Callable[[Version], str]) -> list[str]:
    """Lines of a ``git log --graph --oneline``-style drawing of `versions` (newest first).

    One lane per line of descent: ``*`` marks a version, ``|`` a lane that
    continues, ``/`` two lanes joining (a branch point, read upwards: a
    branch starts here), ``\\`` a lane opening for the second parent of a
    merge.  Parents outside `versions` are not drawn.
    """
    shown = {v.id for v in versions}
    lanes: list[str] = []
    out: list[str] = []
    for v in versions:
        cols = [i for i, x in enumerate(lanes) if x == v.id]
        if cols:
            c = cols[0]
        else:
            lanes.append(v.id)
            c = len(lanes) - 1
        for j in sorted(cols[1:], reverse=True):  # other lanes waiting for v join it first
            marks = {2 * i: "|" for i in range(j)}
            marks.update({2 * i - 1: "/" for i in range(j, len(lanes))})
            out.append(_row(2 * len(lanes), marks))
            del lanes[j]
        width = 2 * len(lanes)
        marks = {2 * i: "|" for i in range(len(lanes))}
        marks[2 * c] = "*"
        out.append(_row(width, marks).ljust(width - 1) + " " + describe(v))
        parents = [p for p in v.parents if p in shown]
        if not parents:
            del lanes[c]
            if c < len(lanes):  # lanes to the right move left
                marks = {2 * i: "|" for i in range(c)}
                marks.update({2 * i + 1: "/" for i in range(c, len(lanes))})
                out.append(_row(2 * len(lanes) + 2, marks))
            continue
        lanes[c] = parents[0]
        for p in parents[1:]:
            if p in lanes:
                continue
            marks = {2 * i: "|" for i in range(c + 1)}
            marks.update({2 * i + 1: "\\" for i in range(c, len(lanes))})
            lanes.insert(c + 1, p)
            out.append(_row(2 * len(lanes), marks))
    return out


def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024**exp:.1f} {'BKMGT'[exp]}iB"
