"""Integrity of a lineage History's metadata: every byte a read depends on is sealed.

Damage to a manifest, the graph or the root raises CorruptCheckpointError naming the
version and the file, or is harmless (the data returned is bit-identical); a damaged
version is reported, never silently dropped.
"""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from vlcc_adjoint._lineage._graph import Graph, graph_file, parse_graph_file
from vlcc_adjoint.lineage import CorruptCheckpointError, History, StorageError
from vlcc_adjoint.storage import format as SF


def two_branch_history(path):
    """Two versions on two branches; a dict spec with a float scalar and a string, two leaves
    of different dtypes (several chunks each)."""
    a = {
        "u": np.arange(12, dtype=np.float64),
        "k": np.arange(5, dtype=np.int32),
        "dt": 0.25,
        "name": "run",
    }
    b = {
        "u": np.arange(12, dtype=np.float64) * 2,
        "k": np.arange(5, dtype=np.int32) + 1,
        "dt": 0.5,
        "name": "run-b",
    }
    with History(path, chunk_bytes=32) as h:
        va = h.commit(a, message="first", meta={"step": 1, "loss": 0.5})
        vb = h.commit(b, message="second", meta={"step": 2}, branch="exp")
    return {va: a, vb: b}


def assert_same(x, y):
    assert type(x) is type(y)
    if isinstance(x, np.ndarray):
        assert x.dtype.str == y.dtype.str and x.shape == y.shape and x.tobytes() == y.tobytes()
    elif isinstance(x, dict):
        assert list(x) == list(y)
        for k in x:
            assert_same(x[k], y[k])
    else:
        assert x == y


def manifest_path(repo, vid):
    return repo / "versions" / vid / "zarr.json"


def edit_manifest(repo, vid, edit, reseal: bool = False):
    """Change a version's manifest attributes in place (re-sealed: a crafted manifest)."""
    path = manifest_path(repo, vid)
    doc = json.loads(path.read_text())
    attrs = doc["attributes"]["vlcc_lineage"]
    edit(attrs)
    if reseal and "digest" in attrs:
        attrs = SF.seal(attrs)
        doc["attributes"]["vlcc_lineage"] = attrs
        gpath = repo / "graph" / "zarr.json"
        graph = parse_graph_file(gpath.read_bytes(), str(gpath))
        for node in graph["graph"]["nodes"]:
            if node["id"] == vid:
                node["digest"] = attrs["digest"]
        gpath.write_bytes(graph_file(Graph.from_json(graph)))
    path.write_text(json.dumps(doc))


def rename_key(d: dict, old: str, new: str) -> None:
    """Rename key `old` of a state spec's dict node (the names of the state's entries)."""
    tree = d["spec"]["tree"]
    tree["dict"] = [new if k == old else k for k in tree["dict"]]


# -- the findings ------------------------------------------------------------------------


def test_a_renamed_key_in_a_manifest_is_reported_not_returned(tmp_path):
    states = two_branch_history(tmp_path / "h")
    vid = next(iter(states))
    edit_manifest(tmp_path / "h", vid, lambda a: rename_key(a, "u", "v"))
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as err:
            h.load(vid)
    assert err.value.path == str(manifest_path(tmp_path / "h", vid))
    assert vid in str(err.value) and err.value.key == vid


@pytest.mark.parametrize("field", ["scalar", "string", "message", "meta", "shape", "address"])
def test_an_edited_value_in_a_manifest_is_reported_not_returned(tmp_path, field):
    states = two_branch_history(tmp_path / "h")
    vid = next(iter(states))

    def edit(attrs):
        items = attrs["spec"]["tree"]["items"]
        names = attrs["spec"]["tree"]["dict"]
        if field == "scalar":
            items[names.index("dt")] = {"value": 0.75}
        elif field == "string":
            items[names.index("name")] = {"value": "other"}
        elif field == "message":
            attrs["message"] = "forged"
        elif field == "meta":
            attrs["meta"]["step"] = 99
        elif field == "shape":
            attrs["leaves"][0]["shape"] = [6]
            attrs["leaves"][0]["chunks"] = attrs["leaves"][0]["chunks"][:2]
        else:
            attrs["leaves"][0]["chunks"][0] = attrs["leaves"][0]["chunks"][1]

    edit_manifest(tmp_path / "h", vid, edit)
    with History(tmp_path / "h", mode="r") as h:
        with pytest.raises(CorruptCheckpointError) as err:
            h.load(vid)
        assert err.value.path == str(manifest_path(tmp_path / "h", vid))
        other = [v for v in states if v != vid][0]
        assert_same(h.load(other), states[other])  # the other version is untouched


def test_a_manifest_swapped_for_another_versions_is_reported(tmp_path):
    states = two_branch_history(tmp_path / "h")
    va, vb = list(states)
    text = manifest_path(tmp_path / "h", vb).read_text().replace(vb, va)
    manifest_path(tmp_path / "h", va).write_text(text)
    with History(tmp_path / "h", mode="r") as h, pytest.raises(CorruptCheckpointError):
        h.load(va)


def test_a_version_whose_manifest_is_missing_is_reported_not_dropped(tmp_path):
    states = two_branch_history(tmp_path / "h")
    vid = next(iter(states))
    manifest_path(tmp_path / "h", vid).unlink()
    with History(tmp_path / "h", mode="r") as h:
        assert vid in {v.id for v in h.log(all=True)}  # still listed ...
        with pytest.raises(CorruptCheckpointError, match="missing") as err:
            h.load(vid)  # ... and reported as damaged
        assert err.value.path == str(manifest_path(tmp_path / "h", vid))


def _metadata_files(repo):
    return sorted(p for p in repo.rglob("zarr.json"))


def _check_or_damage(repo, states, log):
    """Open and read everything; return normally only if every value is the original."""
    with History(repo, mode="r") as h:
        assert {v.id: (v.message, v.meta, v.parents, v.branch) for v in h.log(all=True)} == log
        for vid, state in states.items():
            assert_same(h.load(vid), state)


def test_every_flipped_byte_of_every_metadata_file_is_detected_or_harmless(tmp_path):
    repo = tmp_path / "h"
    states = two_branch_history(repo)
    with History(repo, mode="r") as h:
        log = {v.id: (v.message, v.meta, v.parents, v.branch) for v in h.log(all=True)}
        branches = h.branches
    files = _metadata_files(repo)
    read = {repo / "zarr.json", repo / "graph" / "zarr.json"} | {
        manifest_path(repo, v) for v in states
    }
    assert read <= set(files)
    detected = harmless = 0
    for path in files:
        original = path.read_bytes()
        positions = range(len(original)) if path in read else range(0, len(original), 7)
        for i in positions:
            damaged = bytearray(original)
            damaged[i] ^= 0x01
            path.write_bytes(bytes(damaged))
            try:
                _check_or_damage(repo, states, log)
                with History(repo, mode="r") as h:
                    assert h.branches == branches
                harmless += 1
            except CorruptCheckpointError as err:  # never a bare ValueError, KeyError...
                assert err.path == str(path), (path, i, err)
                assert str(path) in str(err)
                detected += 1
        path.write_bytes(original)
    # The files the reader does not interpret (the zarr arrays' own metadata, the
    # directories' groups) are harmless however damaged: removing them changes nothing.
    for path in set(files) - read:
        path.unlink()
    _check_or_damage(repo, states, log)
    assert detected > 1000 and harmless > 0


# -- failures while writing ----------------------------------------------------------------


def test_enospc_midway_through_a_chunk_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "h"
    with History(path) as h:
        h.commit({"x": np.zeros(10)})
        h.wait()
        real = SF.write_all

        def full_disk(fd, data):
            view = memoryview(data).cast("B")
            if len(view) > 1000:  # a chunk: half of it, then the disk is full
                real(fd, view[: len(view) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data)

        monkeypatch.setattr(SF, "write_all", full_disk)
        bad = h.commit({"x": np.arange(5000.0)})
        with pytest.raises(StorageError, match=f"version {bad}.*No space left"):
            h.wait()
        monkeypatch.undo()
        assert sorted(e.name for e in os.scandir(path / "scratch")) == ["zarr.json"]
    assert sorted(e.name for e in os.scandir(path / "scratch")) == ["zarr.json"]


def test_a_writer_killed_midway_leaves_debris_that_the_next_writer_removes(tmp_path):
    path = tmp_path / "h"
    with History(path) as h:
        vid = h.commit({"x": np.ones(3)})
    (path / "scratch" / "c-4242-deadbeef").write_bytes(b"half a chunk")
    with History(path, mode="r") as h:  # readers never delete
        assert h.load(vid)["x"].sum() == 3
    assert (path / "scratch" / "c-4242-deadbeef").exists()
    History(path).close()
    assert not (path / "scratch" / "c-4242-deadbeef").exists()


def test_a_file_given_as_the_repository_is_a_clear_error(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("hello")
    for mode in ("a", "r"):
        with pytest.raises(StorageError, match="not a directory.*give History a new path") as err:
            History(f, mode=mode)
        assert str(f) in str(err.value)
    assert f.read_text() == "hello"


def test_format_1_repositories_are_still_read(tmp_path):
    """A repository written before seals (format 1): read, then appended to."""
    repo = tmp_path / "h"
    states = two_branch_history(repo)
    # Rewrite it as format 1 wrote it: no digests anywhere.
    for vid in states:
        path = manifest_path(repo, vid)
        doc = json.loads(path.read_text())
        attrs = doc["attributes"]["vlcc_lineage"]
        del attrs["digest"]
        attrs["format"] = 1
        path.write_text(json.dumps(doc, separators=(",", ":")))
    root = json.loads((repo / "zarr.json").read_text())
    del root["attributes"]["vlcc_lineage"]["digest"]
    root["attributes"]["vlcc_lineage"]["format"] = 1
    (repo / "zarr.json").write_text(json.dumps(root))
    gpath = repo / "graph" / "zarr.json"
    graph = parse_graph_file(gpath.read_bytes(), str(gpath))
    graph["format"] = 1
    for node in graph["graph"]["nodes"]:
        del node["digest"]
    gpath.write_text(
        json.dumps(
            {"zarr_format": 3, "node_type": "group", "attributes": {"vlcc_lineage_graph": graph}},
            separators=(",", ":"),
        )
    )
    with History(repo, mode="r") as h:  # a reader changes nothing
        for vid, state in states.items():
            assert_same(h.load(vid), state)
    assert json.loads((repo / "zarr.json").read_text())["attributes"]["vlcc_lineage"]["format"] == 1
    with History(repo) as h:  # a writer seals the root as format 2 (older readers refuse it)
        new = h.commit({"x": np.ones(4)}, branch="exp")
    assert json.loads((repo / "zarr.json").read_text())["attributes"]["vlcc_lineage"]["format"] == 2
    with History(repo, mode="r") as h:
        assert h.load(new)["x"].sum() == 4 and len(h) == 3
        for vid, state in states.items():
            assert_same(h.load(vid), state)
