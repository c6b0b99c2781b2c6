"""The serial pieces of distributed versions (no MPI): Blocks, regrouping a spec, the
reader's decomposition.  ``test_lineage_mpi.py`` runs them under ``mpiexec``."""

from __future__ import annotations

import numpy as np
import pytest

from vlcc_adjoint._lineage._ranks import (
    BLOCKS_TYPE,
    DISTRIBUTED_TYPE,
    Blocks,
    assemble,
    regroup,
)
from vlcc_adjoint.errors import VlccTypeError, VlccValueError
from vlcc_adjoint.mpi import (
    Decomposition,
    DistributedArray,
    box_intersection,
    reader_decomposition,
)
from vlcc_adjoint.state import flatten, unflatten


def test_blocks_flatten_to_one_leaf_per_rank_and_rebuild_as_the_global_array():
    d = Decomposition.split((7, 5), (3, 2))
    glob = np.arange(35.0).reshape(7, 5)
    leaves, spec = flatten({"u": Blocks(d, tuple(glob[d.slices(r)] for r in range(6))), "t": 1})
    assert len(leaves) == 6 and spec["tree"]["items"][0]["type"] == BLOCKS_TYPE
    out = unflatten(spec, leaves)
    assert out["t"] == 1 and out["u"].tobytes() == glob.tobytes()


@pytest.mark.parametrize(
    "blocks, said",
    [
        (lambda g, d: [g[d.slices(r)] for r in range(d.nranks - 1)], "blocks for a decomposition"),
        (lambda g, d: [g[d.slices(r)].T for r in range(d.nranks)], "has shape"),
        (
            lambda g, d: [
                g[d.slices(r)].astype(np.float32 if r else np.float64) for r in range(d.nranks)
            ],
            "several dtypes",
        ),
    ],
)
def test_blocks_that_do_not_tile_their_decomposition_are_refused(blocks, said):
    d = Decomposition.split((6, 4), (2, 1))
    glob = np.arange(24.0).reshape(6, 4)
    with pytest.raises(VlccValueError, match=said):
        assemble(d, blocks(glob, d))


def test_regroup_turns_a_ranks_block_into_every_ranks_blocks_and_renumbers_the_others():
    d = Decomposition.split((6,), 3)
    state = {"a": np.zeros(2), "u": DistributedArray(np.ones(2), d, 1), "b": np.zeros(3)}
    leaves, spec = flatten(state)

    def to_blocks(node, old, entries):
        assert old == [1]
        return (
            {"type": BLOCKS_TYPE, "aux": {"decomposition": d.to_json()}},
            [{"dtype": entries[0]["dtype"], "shape": [2]} for _ in range(3)],
        )

    out = regroup(spec, DISTRIBUTED_TYPE, to_blocks)
    a, u, b = out["tree"]["items"]
    assert a == {"leaf": 0} and b == {"leaf": 4}
    assert [x["leaf"] for x in u["items"]] == [1, 2, 3] and len(out["leaves"]) == 5
    assert spec["tree"]["items"][2] == {"leaf": 2}  # the input is left alone


def test_regroup_refuses_a_node_whose_leaves_are_not_consecutive():
    d = Decomposition.split((4,), 2)
    leaves, spec = flatten({"u": Blocks(d, (np.zeros(2), np.zeros(2)))})
    spec["tree"]["items"][0]["items"][1]["leaf"] = 0
    with pytest.raises(VlccValueError, match="not consecutive"):
        regroup(spec, BLOCKS_TYPE, lambda node, old, entries: ({}, []))


def test_the_readers_decomposition_defaults_to_the_stored_one_then_to_slabs():
    stored = Decomposition.split((10, 4), (2, 2))
    shape = stored.global_shape
    assert reader_decomposition(None, shape, 4, stored) == stored
    assert reader_decomposition(None, shape, 3, stored) == Decomposition.split((10, 4), 3)
    assert reader_decomposition(None, shape, 3) == Decomposition.split((10, 4), 3)
    assert reader_decomposition(None, shape, 1).local_shape(0) == (10, 4)  # the whole array
    assert reader_decomposition(None, (), 1).local_shape(0) == ()  # a 0-d array, one rank
    mine = Decomposition.split((10, 4), (1, 3))
    assert reader_decomposition(mine, shape, 3, stored) == mine
    assert reader_decomposition(lambda s: Decomposition.split(s, 5), shape, 5).nranks == 5
    with pytest.raises(VlccValueError, match="has 3 ranks but 2 ranks read"):
        reader_decomposition(mine, shape, 2, stored)
    with pytest.raises(VlccValueError, match="does not decompose the stored global shape"):
        reader_decomposition(Decomposition.split((9, 4), 3), shape, 3, stored)
    with pytest.raises(VlccTypeError, match="must be a vlcc_adjoint.mpi.Decomposition"):
        reader_decomposition("slabs", shape, 3)


def test_boxes_share_their_common_part_or_nothing():
    assert box_intersection(((0, 4), (2, 6)), ((3, 8), (0, 3))) == ((3, 4), (2, 3))
    assert box_intersection(((0, 4),), ((4, 8),)) is None  # touching is not sharing
    assert box_intersection((), ()) == ()  # 0-d arrays: their one element
