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
parent -> child.  The file is read into a :class:`Graph` on open and after
every change by another process; it is validated (ids, parents, refs,
acyclicity) and never executed.  In memory each version is kept once, as
its JSON text, beside a compact index of ids, ``seq`` and parents (see
:class:`Graph`); the ``networkx.DiGraph`` is built from it when asked for.

The graph file is sealed (:func:`graph_file`) by the digest of the
bytes of its JSON text as written
(:func:`vlcc_adjoint.storage.format.sealed_text_group`), not of a canonical
re-encoding: a commit to a long history assembles the text from the
versions' texts (:meth:`Graph.dumps`), and re-encoding thousands of
versions on every publication is what keeping the texts avoids.  The graph's format number
sits inside the hashed text and each node repeats its manifest's digest, so
a sealed graph cannot pass for a format 1 one (which has no seal), nor a
manifest be swapped for another well-sealed one, by a changed byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import networkx as nx

from ..errors import VlccKeyError, VlccValueError
from ..storage import CorruptCheckpointError
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
_TEXT_KEYS = [*_NODE_KEYS, "id"]  # the keys of a version's text, in order
_DIGEST = re.compile(r"[0-9a-f]{32}")
_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


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


def _encode_node(vid: str, attrs: dict) -> str:
    """The JSON text of one version in the graph file: its attributes, then ``"id"``.

    `attrs` holds the keys of ``_NODE_KEYS`` in that order (as ``add`` and
    ``from_json`` build them); ASCII, no NaN, no spaces.
    """
    return _ENCODE({**attrs, "id": vid})


def _join(texts: list[str]) -> tuple[str, list[int]]:
    """`texts` joined by ``,``, and the offset where each begins."""
    starts = []
    at = 0
    for text in texts:
        starts.append(at)
        at += len(text) + 1
    return ",".join(texts), starts


# A version's text ends with its id, the last key; followed by the next version's
# text (",") or the end of the list.
_NODE_END = re.compile(r'"id":"([0-9a-f]{12})"\}(?=,|\Z)')


def _encode_nodes(nodes: list[dict]) -> tuple[str, list[int]]:
    """The texts of `nodes` (attribute dicts ending with ``"id"``, as
    :func:`_encode_node` orders them) joined by ``,``, and where each begins.

    The list is encoded by one call of the encoder (its text is the versions'
    texts joined by ``,``, in brackets), and the ends of the versions are found
    by their last key, ``"id":"<id>"}`` followed by ``,`` or the end.  The same
    pattern may occur inside a version's ``meta`` (only as a key, since quotes
    inside strings are escaped), so the occurrences are the ends exactly when
    there are as many as versions, with the versions' ids in order (every end
    is an occurrence).  Otherwise each version is encoded alone.
    """
    text = _ENCODE(nodes)[1:-1]
    ends = list(_NODE_END.finditer(text))
    if len(ends) == len(nodes) and all(
        m.group(1) == node["id"] for m, node in zip(ends, nodes, strict=True)
    ):
        return text, [0, *(m.end() + 1 for m in ends[:-1])] if nodes else []
    return _join([_ENCODE(node) for node in nodes])


class NodeAttrs(Mapping[str, Any]):
    """The attributes of one version (``graph.nodes[vid]``), read on demand.

    ``seq`` and ``parents`` come from the graph's index (no parsing); any other
    key parses the version's text, once per view (:meth:`Graph.attrs`).  A
    view is made by each ``graph.nodes[vid]`` and holds nothing else.
    """

    __slots__ = ("_attrs", "_graph", "_vid")

    def __init__(self, graph: Graph, vid: str) -> None:
        self._graph = graph
        self._vid = vid
        self._attrs: dict | None = None

    def __getitem__(self, key: str) -> Any:
        if key == "seq":
            return self._graph.seq(self._vid)
        if key == "parents":
            return self._graph.parents(self._vid)
        if self._attrs is None:
            self._attrs = self._graph.attrs(self._vid)
        return self._attrs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_NODE_KEYS)

    def __len__(self) -> int:
        return len(_NODE_KEYS)

    def __repr__(self) -> str:
        return f"NodeAttrs({self._vid!r}, {dict(self)!r})"


class NodeTable(Mapping[str, NodeAttrs]):
    """``graph.nodes``: version id -> :class:`NodeAttrs`, in publication order (read only)."""

    __slots__ = ("_graph",)

    def __init__(self, graph: Graph) -> None:
        self._graph = graph

    def __getitem__(self, vid: str) -> NodeAttrs:
        if vid not in self._graph:
            raise VlccKeyError(vid)
        return NodeAttrs(self._graph, vid)

    def __contains__(self, vid: object) -> bool:
        return vid in self._graph

    def __iter__(self) -> Iterator[str]:
        return iter(self._graph)

    def __len__(self) -> int:
        return len(self._graph)


class Graph:
    """The in-memory graph and refs of a repository.

    **One description per version.**  A version is held once, as its JSON
    text inside the text of the file's ``nodes`` list (``_nodes_text``, the
    fragments joined by ``,`` in publication order, with ``_starts`` the
    offset of each); its edges likewise (``_edges_text``).  Beside the text,
    a compact index serves navigation without parsing: the ids in
    publication order (``_ids``, with ``_pos`` mapping an id to its
    position), and in typed arrays the ``seq`` of each version and the
    position of its first parent (``-1`` for a root), with the other parents
    of merges in ``_more``.  Every other attribute (message, meta, digest,
    ...) is parsed from the version's text when asked for (:attr:`nodes`,
    :meth:`attrs`, :meth:`version`).  The index is derived from the same
    input as the text, when a version is added or the file is read, and
    neither changes afterwards, so they cannot disagree.

    Per version this costs the text (about 250 bytes) and about 150 bytes of
    index (the id string, its dict entry and position, 32 bytes of arrays),
    where a dict of attributes per version, a cache of each version's text
    and the joined text cost about three times as much (tested in
    ``tests/lineage/test_lineage_memory.py``).

    **Commit cost.**  Publication only appends: :meth:`add` encodes the one
    new version and appends its text, so writing the graph file after a
    commit never re-encodes the other versions (the file's bytes are the
    cached texts, joined).  Reading the file (:meth:`from_json`) encodes each
    version once; :meth:`remove` (gc) re-encodes the versions whose parents
    change.

    An installed Graph is never changed: writers change a :meth:`clone`,
    which copies the index and shares the (immutable) texts.  The
    ``networkx.DiGraph`` (:attr:`g`) is built on first use.
    """

    def __init__(self) -> None:
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.head = "main"
        self.next_seq = 0
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._seq = array("q")
        self._first = array("q")  # position of the first parent; -1: a root
        self._more: dict[int, tuple[int, ...]] = {}  # a merge's other parents' positions
        self._starts = array("q")  # where each version's text begins in _nodes_text
        self._nodes_text = ""
        self._edges_text = ""
        self._nx: nx.DiGraph | None = None

    def clone(self) -> Graph:
        other = Graph()
        other.branches = dict(self.branches)
        other.tags = dict(self.tags)
        other.head, other.next_seq = self.head, self.next_seq
        other._ids = list(self._ids)
        other._pos = dict(self._pos)
        other._seq = array("q", self._seq)
        other._first = array("q", self._first)
        other._more = dict(self._more)
        other._starts = array("q", self._starts)
        other._nodes_text, other._edges_text = self._nodes_text, self._edges_text
        return other

    @property
    def g(self) -> nx.DiGraph:
        """The DAG as networkx (edges parent -> child, the attributes on the nodes)."""
        if self._nx is None:
            g = nx.DiGraph()
            for i, vid in enumerate(self._ids):
                g.add_node(vid, **self._attrs_at(i))
                for p in self._parent_ids(i):
                    g.add_edge(p, vid)
            self._nx = g
        return self._nx

    # -- the index and the texts ------------------------------------------------------

    def _parent_ids(self, i: int) -> list[str]:
        first = self._first[i]
        if first < 0:
            return []
        ids = self._ids
        more = self._more.get(i)
        return [ids[first]] if more is None else [ids[first], *(ids[j] for j in more)]

    def _text_at(self, i: int) -> str:
        end = self._starts[i + 1] - 1 if i + 1 < len(self._starts) else len(self._nodes_text)
        return self._nodes_text[self._starts[i] : end]

    def _attrs_at(self, i: int) -> dict:
        attrs = json.loads(self._text_at(i))
        del attrs["id"]
        return attrs

    def _append(self, vid: str, seq: int, parents: list[str]) -> None:
        """Index version `vid` (its parents indexed before it); its text is placed by the caller."""
        if vid in self._pos:
            raise VlccValueError(f"version {vid} is in the graph already")
        pos = [self._pos[p] for p in parents]
        i = len(self._ids)
        self._ids.append(vid)
        self._pos[vid] = i
        self._seq.append(seq)
        self._first.append(pos[0] if pos else -1)
        if len(pos) > 1:
            self._more[i] = tuple(pos[1:])

    @staticmethod
    def _edges_of(vid: str, parents: list[str]) -> str:
        return ",".join(f'{{"source":"{p}","target":"{vid}"}}' for p in parents)

    def _rebuild(
        self, versions: list[tuple[str, int, list[str]]], texts: tuple[str, Iterable[int]]
    ) -> None:
        """Index `versions` (id, seq, parent ids; parents first) from scratch, with
        `texts` their texts joined by ``,`` and where each begins (:func:`_join`)."""
        self._ids, self._pos, self._more = [], {}, {}
        self._seq, self._first = array("q"), array("q")
        for vid, seq, parents in versions:
            self._append(vid, seq, parents)
        self._nodes_text, self._starts = texts[0], array("q", texts[1])
        self._edges_text = ",".join(
            self._edges_of(vid, parents) for vid, _, parents in versions if parents
        )
        self._nx = None

    # -- JSON -----------------------------------------------------------------------

    def dumps(self) -> str:
        """The graph's JSON text: ``networkx.node_link_data(g, edges="edges")`` plus refs.

        ``nodes`` is in publication order (its insertion order: parsing keeps the
        file's order, which is that order, and ``add`` appends).
        """
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
            + self._nodes_text
            + '],"edges":['
            + self._edges_text
            + "]}}"
        )

    def to_json(self) -> dict:
        return json.loads(self.dumps())

    @classmethod
    def from_json(cls, doc: Any) -> Graph:
        """Rebuild and validate (``ValueError`` on anything inconsistent).

        Acyclicity is checked through the publication order: every parent
        must have a smaller ``seq`` than its child, which no cycle can satisfy.
        Each version's text is encoded from its validated attributes (only
        the keys of the format, in their order), so what the graph holds and
        writes back is what was checked.
        """
        return cls._from_doc(doc, None)

    @classmethod
    def _from_doc(cls, doc: Any, texts: tuple[str, list[int]] | None) -> Graph:
        """:meth:`from_json`, keeping `texts` (the versions' texts as read, joined,
        and where each begins: :func:`_split_text`) as the versions' texts when
        every version holds exactly the keys of the format in their order, so
        that each text parses to the attributes validated here."""
        if not isinstance(doc, dict) or doc.get("format") not in (1, GRAPH_FORMAT):
            raise VlccValueError("unknown graph format")
        self = cls()
        data = doc.get("graph")
        if not (
            isinstance(data, dict)
            and isinstance(data.get("nodes"), list)
            and isinstance(data.get("edges"), list)
        ):
            raise VlccValueError("no node-link graph")
        nodes: dict[str, dict] = {}
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
            if node["id"] in nodes:
                raise VlccValueError(f"version {node['id']} is listed twice")
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
        if texts is None or any(list(node) != _TEXT_KEYS for node in data["nodes"]):
            texts = _encode_nodes([{**attrs, "id": vid} for vid, attrs in nodes.items()])
        self._rebuild(
            [(vid, attrs["seq"], attrs["parents"]) for vid, attrs in nodes.items()], texts
        )
        return self

    # -- queries --------------------------------------------------------------------

    def __contains__(self, vid) -> bool:
        return vid in self._pos

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        """The version ids in publication order."""
        return iter(self._ids)

    @property
    def nodes(self) -> NodeTable:
        """Version id -> its attributes (``seq``, ``parents``, ``branch``, ``message``,
        ``meta``, ``created``, ``nbytes``, ``new_bytes``, ``digest``), in publication
        order; a read-only view (change a graph through :meth:`add` and :meth:`remove`)."""
        return NodeTable(self)

    def seq(self, vid: str) -> int:
        """The publication number of version `vid`."""
        return self._seq[self._pos[vid]]

    def parents(self, vid: str) -> list[str]:
        """The parents of version `vid`, first parent first."""
        return self._parent_ids(self._pos[vid])

    def attrs(self, vid: str) -> dict:
        """Every attribute of version `vid` (a new dict, parsed from its text)."""
        return self._attrs_at(self._pos[vid])

    def version(self, vid: str) -> Version:
        return self._version(vid, self.attrs(vid))

    def _version(self, vid: str, a: dict) -> Version:
        """The :class:`Version` `vid` of attributes `a` (parsed from its text)."""
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
        """The versions `ids`, newest first.

        Each version's attributes are parsed from its text; when a quarter or
        more of the graph is asked for (``log`` of a whole history), every
        text is parsed in one call (the joined texts are a JSON list's
        inside), which costs less than one call per version.
        """
        order = sorted(ids, key=self.seq, reverse=True)
        if 4 * len(order) < len(self._ids):
            return [self.version(v) for v in order]
        every = json.loads("[" + self._nodes_text + "]")
        return [self._version(v, every[self._pos[v]]) for v in order]

    def ancestors(self, vid: str) -> set[str]:
        """Every version `vid` descends from (not itself)."""
        seen: set[int] = set()
        first, more = self._first, self._more
        stack = [self._pos[vid]]
        while stack:
            i = stack.pop()
            parents = [first[i]] if first[i] >= 0 else []
            parents.extend(more.get(i, ()))
            for j in parents:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return {self._ids[j] for j in seen}

    def first_parents(self, vid: str) -> list[str]:
        """`vid` and its first-parent ancestors, newest first."""
        out = []
        i = self._pos[vid]
        while i >= 0:
            out.append(self._ids[i])
            i = self._first[i]
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
        """Publish version `vid` (its parents are in the graph): encode its text
        and append it, the one version; the others' texts are reused as they are."""
        parents = list(parents)
        text = _encode_node(
            vid,
            {
                "seq": self.next_seq,
                "parents": parents,
                "branch": branch,
                "message": message,
                "meta": meta,
                "created": created,
                "nbytes": int(nbytes),
                "new_bytes": int(new_bytes),
                "digest": digest,
            },
        )
        self._append(vid, self.next_seq, parents)
        self._starts.append(len(self._nodes_text) + 1 if self._nodes_text else 0)
        self._nodes_text = f"{self._nodes_text},{text}" if self._nodes_text else text
        if parents:
            edges = self._edges_of(vid, parents)
            self._edges_text = f"{self._edges_text},{edges}" if self._edges_text else edges
        self.next_seq += 1
        self._nx = None

    def remove(self, doomed: set[str]) -> None:
        """Remove versions, splicing them out: a kept version's parents become its
        nearest kept ancestors (in order, without duplicates)."""
        memo: dict[str, list[str]] = {}
        for i, vid in enumerate(self._ids):  # publication order: parents first
            out: list[str] = []
            for p in self._parent_ids(i):
                for q in memo[p] if p in doomed else [p]:
                    if q not in out:
                        out.append(q)
            memo[vid] = out
        for vid in doomed:
            if vid not in self._pos:
                raise VlccKeyError(f"no version {vid!r} in the graph to remove")
        kept = []
        texts = []
        for i, vid in enumerate(self._ids):
            if vid in doomed:
                continue
            text = self._text_at(i)
            if memo[vid] != self._parent_ids(i):
                attrs = json.loads(text)  # "id" stays last
                attrs["parents"] = memo[vid]
                text = _ENCODE(attrs)
            kept.append((vid, self._seq[i], memo[vid]))
            texts.append(text)
        self._rebuild(kept, _join(texts))
        self.tags = {t: v for t, v in self.tags.items() if v not in doomed}


# -- the graph file -----------------------------------------------------------------------


def graph_file(g: Graph) -> bytes:
    """``graph/zarr.json`` holding the graph `g` (the JSON text of :meth:`Graph.dumps`), sealed."""
    return SF.sealed_text_group(GRAPH_KEY, g.dumps().encode("ascii"))


# Graph.dumps() writes the refs, then this, then the versions' texts joined by
# ",", then the edges after _EDGES_OPEN, then "}}".
_NODES_OPEN = ',"graph":{"directed":true,"multigraph":false,"graph":{},"nodes":['
_EDGES_OPEN = '],"edges":'


def _split_text(text: str, path: str) -> tuple[dict, tuple[str, list[int]]] | None:
    """The graph document in `text` and its versions' texts as written, when
    `text` is laid out as :meth:`Graph.dumps` writes it; ``None`` otherwise.

    The text is walked in that layout: the refs (a JSON object closed where
    ``_NODES_OPEN`` begins, without a ``"graph"`` key), each version parsed
    where the previous one ended (:func:`~vlcc_adjoint.storage.format.parse_json_at`,
    the strict parser), separated by ``,``, then the edges, then the end.
    When every step holds, the text is exactly that document, so the
    document returned is what a parse of the whole text gives, and each
    version's text is the part of `text` its attributes were parsed from:
    the graph keeps those parts instead of encoding the versions again.
    """
    at = text.find(_NODES_OPEN)
    if at < 0:
        return None
    try:
        head, end = SF.parse_json_at(text[:at] + "}", 0, path)
        if end != at + 1 or not isinstance(head, dict) or "graph" in head:
            return None
        first = pos = at + len(_NODES_OPEN)
        nodes: list[Any] = []
        starts: list[int] = []
        if not text.startswith("]", pos):
            while True:
                node, end = SF.parse_json_at(text, pos, path)
                nodes.append(node)
                starts.append(pos - first)
                if not text.startswith(",", end):
                    pos = end
                    break
                pos = end + 1
        if not text.startswith(_EDGES_OPEN, pos):
            return None
        edges, end = SF.parse_json_at(text, pos + len(_EDGES_OPEN), path)
    except CorruptCheckpointError:
        return None  # not this layout: the whole text is parsed (and refused if invalid)
    if text[end:] != "}}":
        return None
    graph = {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "edges": edges}
    return {**head, "graph": graph}, (text[first:pos], starts)


def _sealed_document(doc: Any, path: str) -> dict:
    if not (isinstance(doc, dict) and doc.get("format") == GRAPH_FORMAT):
        raise SF.corrupt_file(path, "the sealed graph is not of format 2")
    return doc


def _unsealed_document(raw: bytes, path: str) -> dict:
    """The graph document of a file without a seal: accepted only as format 1."""
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


def parse_graph_file(raw: bytes, path: str) -> dict:
    """The graph document (``{"format": ..., "graph": ...}``) in the bytes of `path`.

    A sealed file (format 2) must carry the right digest; a file without a
    seal is accepted only as format 1.  ``CorruptCheckpointError`` naming
    `path` otherwise.
    """
    body = SF.open_sealed_text(raw, GRAPH_KEY, path)
    if body is None:
        return _unsealed_document(raw, path)
    return _sealed_document(SF.parse_json(body, path), path)


def read_graph_file(raw: bytes, path: str) -> Graph:
    """The :class:`Graph` in the bytes of `path`: :func:`parse_graph_file`'s
    document, validated by :meth:`Graph.from_json`, keeping the versions'
    texts of a sealed file as written (:func:`_split_text`) rather than
    encoding them again.  ``ValueError`` on an inconsistent graph."""
    body = SF.open_sealed_text(raw, GRAPH_KEY, path)
    if body is None:
        return Graph.from_json(_unsealed_document(raw, path))
    split = _split_text(body.decode("ascii"), path) if body.isascii() else None
    if split is None:
        return Graph.from_json(_sealed_document(SF.parse_json(body, path), path))
    doc, texts = split
    return Graph._from_doc(_sealed_document(doc, path), texts)


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
