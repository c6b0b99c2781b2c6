"""The version graph holds each version once, in a few hundred bytes.

A history kept in memory by a long-running writer (a trainer saving every few
minutes for weeks) must not grow by more than its versions' metadata.  The
graph (:class:`vlcc_adjoint._lineage._graph.Graph`) keeps each version as its
JSON text plus a compact index; it once kept an attribute dict, a cached text
and the joined text of every version, about 1.5 KiB per version.  The measure
is Python's ``tracemalloc`` over many commits after a warm-up, divided by the
number of versions; the bound (600 bytes) is checked to be below what the
three copies cost, so the test fails on that representation.
"""

from __future__ import annotations

import gc
import json
import operator
import secrets
import tracemalloc

import numpy as np
import pytest

from vlcc_adjoint._lineage._graph import Graph, graph_file, parse_graph_file, read_graph_file
from vlcc_adjoint.lineage import History
from vlcc_adjoint.storage import CorruptCheckpointError
from vlcc_adjoint.storage import format as SF

WARMUP = 30
VERSIONS = 300
BOUND = 600  # traced bytes per version


def _per_version(make_versions) -> float:
    """Traced bytes gained per version while `make_versions` makes VERSIONS versions."""
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make_versions()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del kept
    return grown / VERSIONS


def test_commits_grow_memory_by_less_than_600_bytes_per_version(tmp_path):
    state = {"x": np.arange(8.0)}  # the same bytes each time: no new chunks to index
    with History(tmp_path / "h") as h:
        for k in range(WARMUP):
            h.commit(state, "step", {"step": k, "loss": 0.25})
            h.wait()

        def commits():
            for k in range(WARMUP, WARMUP + VERSIONS):
                h.commit(state, "step", {"step": k, "loss": 0.25})
                h.wait()

        per_version = _per_version(commits)
        assert len(h) == WARMUP + VERSIONS
    assert per_version < BOUND, f"{per_version:.0f} bytes per version"


def test_the_bound_fails_on_three_copies_of_each_version():
    # What the graph kept before: per version an attribute dict, its JSON text in a
    # cache keyed by (id, parents), and the joined text of the nodes and edges.
    def three_copies():
        nodes: dict[str, dict] = {}
        frags: dict[tuple, str] = {}
        prev: str | None = None
        for k in range(VERSIONS):
            vid = secrets.token_hex(6)
            attrs = {
                "seq": k,
                "parents": [prev] if prev else [],
                "branch": "main",
                "message": "step",
                "meta": {"step": k, "loss": 0.25},
                "created": 1.7e9 + k,
                "nbytes": 64,
                "new_bytes": 0,
                "digest": secrets.token_hex(16),
            }
            nodes[vid] = attrs
            frags[(vid, tuple(attrs["parents"]))] = json.dumps(
                {**attrs, "id": vid}, separators=(",", ":")
            )
            prev = vid
        text = ",".join(frags.values())
        edges = ",".join(
            f'{{"source":"{p}","target":"{v}"}}' for v, a in nodes.items() for p in a["parents"]
        )
        return nodes, frags, text, edges

    assert _per_version(three_copies) > BOUND


def _graph_with(metas: list[dict]) -> Graph:
    g = Graph()
    prev: str | None = None
    for k, meta in enumerate(metas):
        vid = f"{k:012x}"
        parents = [prev] if prev else []
        if k == 3:
            parents.append(f"{1:012x}")  # a merge
        g.add(vid, parents, "main", f"v{k}", meta, 1.7e9 + k, 8, 8, secrets.token_hex(16))
        g.branches["main"] = prev = vid
    return g


@pytest.mark.parametrize(
    "meta",
    [
        {"step": 1},
        # The end of a version's text ('"id":"<id>"}' then ',') inside its meta:
        # reading must not cut the version there.
        {"runs": [{"id": "0123456789ab"}, {"id": "000000000002"}, 1]},
        {"text": '"id":"0123456789ab"},{"seq":', "id": "000000000000"},
        # The text that opens the list of versions, as keys inside a meta.
        {"graph": {"directed": True, "multigraph": False, "graph": {}, "nodes": [1]}},
    ],
)
@pytest.mark.parametrize("read", ["document", "file"])
def test_a_graph_read_back_holds_the_same_versions_and_writes_the_same_file(meta, read):
    g = _graph_with([{"k": k} if k % 2 else meta for k in range(6)])
    raw = graph_file(g)
    if read == "document":
        back = Graph.from_json(parse_graph_file(raw, "graph/zarr.json"))
    else:
        back = read_graph_file(raw, "graph/zarr.json")
    assert graph_file(back) == raw
    assert list(back.nodes) == list(g.nodes)
    for vid in g.nodes:
        assert back.attrs(vid) == g.attrs(vid) == {**g.nodes[vid]}
        assert back.version(vid).meta == g.version(vid).meta
    assert back.parents(f"{3:012x}") == [f"{2:012x}", f"{1:012x}"]
    assert back.ancestors(f"{3:012x}") == {f"{k:012x}" for k in range(3)}
    assert back.first_parents(f"{3:012x}") == [f"{k:012x}" for k in (3, 2, 1, 0)]


def test_the_nodes_of_a_graph_are_read_only_and_parsed_values_are_copies():
    g = _graph_with([{"step": k} for k in range(3)])
    vid = f"{1:012x}"
    with pytest.raises(TypeError):
        operator.setitem(g.nodes, vid, {})
    g.nodes[vid]["meta"]["step"] = 99  # a parsed copy: the graph is unchanged
    assert g.version(vid).meta == {"step": 1}
    assert g.nodes[vid]["seq"] == g.seq(vid) == 1
    assert g.nodes.get("ffffffffffff") is None


def test_removing_versions_rewrites_only_the_spliced_parents():
    g = _graph_with([{"step": k} for k in range(6)])
    doomed = {f"{2:012x}"}
    g.remove(doomed)
    assert f"{2:012x}" not in g
    # version 3 had parents [2, 1]: 2 splices to its parent 1, which is already there
    assert g.parents(f"{3:012x}") == [f"{1:012x}"]
    assert g.nodes[f"{3:012x}"]["parents"] == [f"{1:012x}"]
    back = Graph.from_json(json.loads(g.dumps()))
    assert graph_file(back) == graph_file(g)
    assert [back.attrs(v) for v in back.nodes] == [g.attrs(v) for v in g.nodes]


def _resealed(text: str) -> bytes:
    return SF.sealed_text_group("vlcc_lineage_graph", text.encode())


def test_reading_a_graph_file_keeps_each_versions_text_as_written():
    g = _graph_with([{"step": k} for k in range(4)])
    # The same values spelled otherwise (an exponent): kept as written, the file
    # written back is the file read, byte for byte.
    text = g.dumps().replace('"created":1700000002.0', '"created":1.700000002e9')
    assert text != g.dumps()
    raw = _resealed(text)
    back = read_graph_file(raw, "graph/zarr.json")
    assert graph_file(back) == raw
    assert back.attrs(f"{2:012x}") == g.attrs(f"{2:012x}")


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace('"nodes":[', '"nodes": [', 1),  # another layout
        lambda t: t.replace('"seq":1,', '"seq":1,"extra":[1,2],', 1),  # a key not of the format
        lambda t: t.replace('"seq":2,"parents"', '"parents":["000000000001"],"seq":2,"x"', 1),
    ],
)
def test_a_graph_file_in_another_layout_is_read_by_its_document(change):
    """Outside the layout Graph.dumps writes, or with versions holding other keys,
    the file is parsed whole and each version encoded from its validated
    attributes: reading it gives what reading its document gives."""
    g = _graph_with([{"step": k} for k in range(4)])
    raw = _resealed(change(g.dumps()))
    try:
        expected = Graph.from_json(parse_graph_file(raw, "graph/zarr.json"))
    except (ValueError, CorruptCheckpointError) as err:
        with pytest.raises(type(err)):
            read_graph_file(raw, "graph/zarr.json")
        return
    back = read_graph_file(raw, "graph/zarr.json")
    assert graph_file(back) == graph_file(expected)
    assert [back.attrs(v) for v in back.nodes] == [expected.attrs(v) for v in expected.nodes]


def test_a_graph_file_with_invalid_json_in_the_layout_is_refused_naming_it():
    g = _graph_with([{"step": k} for k in range(3)])
    for bad in ('"seq":NaN,', '"seq":1,"seq":1,'):
        raw = _resealed(g.dumps().replace('"seq":1,', bad, 1))
        with pytest.raises(CorruptCheckpointError, match="graph/zarr.json"):
            read_graph_file(raw, "graph/zarr.json")
