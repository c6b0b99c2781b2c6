"""split_leaves / join_leaves: the state model's walk for carried objects."""

import collections
import dataclasses

import numpy as np
import pytest

from vlcc_adjoint.errors import VlccValueError
from vlcc_adjoint.state import flatten, join_leaves, split_leaves, unflatten

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Config:
    scale: float
    mask: object


class Opaque:
    """An object no provider knows."""


def test_leaves_are_the_objects_themselves_and_come_back_in_place():
    x, y, z = np.ones(3), np.zeros(2), np.arange(4)
    marker = Opaque()
    state = {"x": x, "rest": [Pair(y, 3), (z, "s", marker)], "c": Config(0.5, marker)}
    leaves, tree = split_leaves(state, lambda o: isinstance(o, np.ndarray) and o.ndim == 1)
    assert [id(a) for a in leaves] == [id(x), id(y), id(z)]
    back = join_leaves(tree, leaves)
    assert back["x"] is x and back["rest"][0].a is y and back["rest"][1][0] is z
    assert type(back["rest"][0]) is Pair and back["rest"][0].b == 3
    assert back["rest"][1][2] is marker and back["c"].mask is marker  # carried as they are
    new = [a + 1 for a in leaves]
    again = join_leaves(tree, new)
    assert again["x"] is new[0] and again["rest"][1][0] is new[2] and back["x"] is x


def test_objects_that_are_not_leaves_travel_by_reference():
    big = np.ones((2, 2))  # an array the predicate does not pick
    leaves, tree = split_leaves({"m": big, "v": np.ones(2)}, lambda o: o.ndim == 1)
    assert len(leaves) == 1
    assert join_leaves(tree, leaves)["m"] is big


def test_a_stored_spec_never_rebuilds_a_carried_object():
    _, spec = flatten({"x": 1})
    spec["tree"]["items"][0] = {"object": [1, 2]}  # crafted: not a node of a stored spec
    with pytest.raises(VlccValueError, match="malformed state spec node"):
        unflatten(spec, [])
