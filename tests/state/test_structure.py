"""The one model of a state's structure (state.Structure, the spec-tree walks
of _layout): the structure check of every kind flatten supports, the first
difference named by its path, byte counts without touching the data, leaf
paths, and the layout walk of the store."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlcc_adjoint import _layout, timestep
from vlcc_adjoint._checks import StateMismatchError, check_seed, signature
from vlcc_adjoint.execute import run_adjoint
from vlcc_adjoint.schedules import Revolve
from vlcc_adjoint.state import (
    Layout,
    LeafProvider,
    Structure,
    UnknownStateTypeError,
    flatten,
    leaf_paths,
    register,
    register_leaf_provider,
    spec_nodes,
    state_nbytes,
    unflatten,
)


@dataclasses.dataclass
class Params:
    c: np.ndarray
    rho: float = 1.0
    name: str = "model"


Point = collections.namedtuple("Point", "x y")


class Box:
    """An array of another library: a leaf provider's (tag ``box``)."""

    def __init__(self, data):
        self.data = np.asarray(data)


CALLS = collections.Counter()


def _box_to_numpy(box):
    CALLS["to_numpy"] += 1
    return box.data, {"box": True}


def _box_describe(box):
    CALLS["describe"] += 1
    return box.data.dtype, box.data.shape, {"box": True}


register_leaf_provider(
    LeafProvider(
        tag="box",
        claims=lambda cls: cls is Box,
        to_numpy=_box_to_numpy,
        from_numpy=lambda arr, node: Box(arr),
        describe=_box_describe,
    )
)


class Blob:
    """An array type whose provider cannot describe without converting (tag ``blob``)."""

    def __init__(self, data):
        self.data = np.asarray(data)


register_leaf_provider(
    LeafProvider(
        tag="blob",
        claims=lambda cls: cls is Blob,
        to_numpy=lambda b: (b.data, {"blob": 1}),
        from_numpy=lambda arr, node: Blob(arr),
    )
)


class Grid:
    """A container registered with functions; its aux (a tuple) is part of its structure."""

    def __init__(self, u, spacing):
        self.u, self.spacing = u, spacing


register(Grid, lambda g: ([g.u], {"spacing": g.spacing}), lambda aux, ch: Grid(ch[0], aux))


def kinds():
    """A state of every kind flatten supports, each a function of a value `v`
    (states of one kind share their structure whatever `v` is)."""
    return {
        "array": lambda v: np.full((2, 3), v),
        "big-endian": lambda v: np.full(3, v, dtype=">f8"),
        "0-d": lambda v: np.array(v),
        "empty": lambda v: np.zeros((0, 4), np.int16),
        "structured": lambda v: np.zeros(2, dtype=[("a", "<f4"), ("b", ">i2", (2,))]),
        "strings": lambda v: np.array(["ab", str(v)], dtype="<U8"),
        "scalars": lambda v: [None, v > 0, int(v), float(v), complex(v, 1), str(v), bytes([1])],
        "nan": lambda v: {"t": math.nan if v > 1 else 1.5},
        "numpy scalars": lambda v: [np.float32(v), np.int8(1), np.bool_(v > 0)],
        "dict": lambda v: {"u": np.ones(3) * v, "t": float(v)},
        "mapping": lambda v: {1: np.ones(2) * v, (2, "x"): "y", None: v},
        "list and tuple": lambda v: [np.ones(2) * v, (np.zeros(1), [])],
        "namedtuple": lambda v: Point(np.ones(2) * v, Point(1, "y")),
        "dataclass": lambda v: Params(c=np.full((2, 2), v), rho=float(v)),
        "user provider": lambda v: Grid(np.ones(3) * v, (0.5, 0.5)),
        "leaf provider": lambda v: {"w": Box(np.ones(4) * v)},
        "leaf provider without describe": lambda v: [Blob(np.ones(2) * v)],
        "nested": lambda v: {"a": [1, (2, {"b": np.ones(3) * v})], "p": Params(np.ones(1))},
    }


KINDS = kinds()


# -- the check of every kind -------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_structure_of_a_state_is_its_flatten_spec_without_touching_the_data(kind):
    state = KINDS[kind](2.0)
    structure = Structure.of(state)
    leaves, spec = flatten(state)
    assert structure.spec() == spec
    assert structure.nbytes == state_nbytes(state) == sum(leaf.nbytes for leaf in leaves)
    assert structure.infos == tuple((leaf.dtype, leaf.shape) for leaf in leaves)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_structure_matches_states_of_its_kind_whatever_their_values(kind):
    make = KINDS[kind]
    structure = Structure.of(make(2.0))
    for value in (2.0, 3.0, -1.0):
        state = make(value)
        assert structure.matches(state), value
        assert structure.mismatch(state) == ""
        assert structure == Structure.of(state)
    for other, make_other in KINDS.items():
        if other != kind:
            state = make_other(2.0)
            assert not structure.matches(state), other
            assert structure.mismatch(state).startswith("state")
            assert structure != Structure.of(state)


def test_an_equal_dtype_built_anew_non_contiguous_arrays_and_memmaps_match(tmp_path):
    structure = Structure.of(np.zeros((4, 3)))
    assert structure.array == (np.dtype("<f8"), (4, 3))
    fresh = np.dtype("<f8").newbyteorder("<")
    assert fresh is not np.dtype("<f8")
    assert structure.matches(np.zeros((4, 3), dtype=fresh))
    assert structure.matches(np.zeros((3, 4)).T)  # flatten copies it: same spec
    mm = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype="<f8", shape=(4, 3))
    assert structure.matches(mm)
    for other in (np.zeros((4, 3), ">f8"), np.zeros((4, 3), "<f4"), np.zeros(12), [np.zeros(3)]):
        assert not structure.matches(other)


def test_scalars_are_compared_by_type_strings_and_numbers_by_nothing_else():
    structure = Structure.of({"t": 0.5, "name": "a", "n": 3, "x": np.float32(1)})
    assert structure.matches({"t": math.inf, "name": "other", "n": -7, "x": np.float32(9)})
    assert structure.mismatch({"t": 1, "name": "a", "n": 3, "x": np.float32(1)}) == (
        "state['t'] is a int, expected a float"
    )
    assert structure.mismatch({"t": 0.5, "name": "a", "n": 3, "x": np.float64(1)}) == (
        "state['x'] is a numpy <f8 scalar, expected a numpy <f4 scalar"
    )
    assert not Structure.of(True).matches(1) and not Structure.of(1).matches(True)
    assert not Structure.of(1.0).matches(np.float64(1.0))  # flatten: a numpy scalar


def test_a_mismatch_is_described_by_the_path_flatten_names():
    reference = {"u": np.zeros(3), "params": Params(np.zeros(2)), "seq": [np.zeros(1), 2]}
    structure = Structure.of(reference)
    cases = {
        "state['params'].c is an array of shape (3,) and dtype <f8, expected shape (2,) "
        "and dtype <f8": {**reference, "params": Params(np.zeros(3))},
        "state['seq'][1] is a str, expected a int": {**reference, "seq": [np.zeros(1), "2"]},
        "state['seq'] has 3 entries, expected 2": {**reference, "seq": [np.zeros(1), 2, 3]},
        "state has key 'v' where 'u' was expected": {
            "v": np.zeros(3),
            "params": Params(np.zeros(2)),
            "seq": [np.zeros(1), 2],
        },
        "state['u'] is a list, expected a array": {**reference, "u": [0.0, 0.0, 0.0]},
        "state['u'] is a box array, expected a array": {**reference, "u": Box(np.zeros(3))},
    }
    for text, state in cases.items():
        assert not structure.matches(state)
        assert structure.mismatch(state) == text
    # The paths are flatten's own: an unknown object there is named the same way.
    with pytest.raises(UnknownStateTypeError, match=r"state\['params'\]\.c: no state provider"):
        flatten({**reference, "params": Params(object())})


def test_a_user_providers_aux_is_structure_and_is_compared_as_json():
    structure = Structure.of(Grid(np.ones(3), (0.5, 0.5)))
    assert structure.tree["aux"] == {"spacing": [0.5, 0.5]}  # the tuple read back as JSON
    assert structure.matches(Grid(np.zeros(3), [0.5, 0.5]))
    assert structure.mismatch(Grid(np.zeros(3), (0.25, 0.5))) == (
        "state is a Grid with {'spacing': [0.25, 0.5]}, expected {'spacing': [0.5, 0.5]}"
    )


def test_leaf_providers_are_described_without_converting_their_arrays():
    CALLS.clear()
    structure = Structure.of({"w": Box(np.ones((2, 5)))})
    assert structure.nbytes == 80 and state_nbytes(Box(np.ones(3, np.float32))) == 12
    assert structure.matches({"w": Box(np.zeros((2, 5)))})
    assert not structure.matches({"w": Box(np.zeros((2, 4)))})
    assert not structure.matches({"w": np.zeros((2, 5))})
    assert CALLS["to_numpy"] == 0 and CALLS["describe"] >= 4
    # Without describe, the provider's to_numpy answers.
    assert Structure.of([Blob(np.ones(2))]).nbytes == 16


def test_objects_no_provider_knows_are_refused_or_compared_by_class():
    class Mesh:
        pass

    with pytest.raises(UnknownStateTypeError, match=r"state\['mesh'\]"):
        Structure.of({"u": np.zeros(2), "mesh": Mesh()})
    structure = Structure.of({"u": np.zeros(2), "mesh": Mesh()}, opaque=True)
    assert structure.matches({"u": np.ones(2), "mesh": Mesh()})
    assert structure.mismatch({"u": np.ones(2), "mesh": object()}).startswith("state['mesh'] is")
    assert signature(object()) == signature(object()) != signature(Mesh())


def test_a_provider_registered_again_under_its_name_still_matches_what_flatten_describes():
    @dataclasses.dataclass
    class Pair:
        a: np.ndarray
        b: np.ndarray

    structure = Structure.of(Pair(np.zeros(2), np.zeros(2)))
    register(Pair)  # the same name, a new provider object
    state = Pair(np.ones(2), np.ones(2))
    assert Structure.of(state) == structure and structure.matches(state)
    register(Pair, name="pair/2")  # another name: flatten records another type
    assert not structure.matches(state)
    assert structure.mismatch(state).startswith("state is a pair/2, expected a ")


# -- agreement of the compiled check with the comparison ------------------------------------


_leaf = st.builds(
    np.zeros,
    st.sampled_from([(2,), (3,), (2, 2), ()]),
    st.sampled_from(["<f8", "<f4", ">f8", "<i4"]),
)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.text(max_size=2),
    st.sampled_from([np.float32(1), np.int64(2)]),
)
_states = st.recursive(
    st.one_of(_leaf, _scalar),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        st.dictionaries(st.sampled_from([1, 2.5, None, (1, "x")]), inner, max_size=2),
        st.builds(Params, inner, st.floats(allow_nan=False), st.just("p")),
        st.builds(Point, inner, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(_states, _states)
def test_the_compiled_check_answers_what_comparing_structures_answers(a, b):
    structure = Structure.of(a)
    other = Structure.of(b)
    equal = structure == other
    assert structure.matches(b) == equal, (a, b)
    assert (structure.mismatch(b) == "") == equal
    assert structure.matches(a)


# -- the executor's checks ----------------------------------------------------------------


def test_a_mismatch_is_found_at_the_step_it_happens_and_named_by_its_path():
    @timestep
    def step(u, i):
        out = {"p": u["p"] * 0.9, "meta": {"t": u["meta"]["t"] + 1.0, "tag": "x"}}
        if i == 6:
            out["meta"]["t"] = int(out["meta"]["t"])  # a float turned int
        return out

    step.adjoint(lambda u, lam, i: lam * 0.9)  # the adjoint: an array, the solver's choice
    u0 = {"p": np.ones(3), "meta": {"t": 0.0, "tag": "x"}}
    with pytest.raises(
        StateMismatchError, match=r"forward step 6 .*state\['meta'\]\['t'\] is a int"
    ):
        run_adjoint(step, Revolve(10, 3), u0, np.ones(3))


def test_the_seed_check_compares_only_what_mirrors_the_state():
    state = signature({"u": np.zeros(4), "params": Params(np.zeros(2)), "n": np.int64(3)})
    check_seed({"u": np.ones(4, np.float32), "params": Params(np.ones(2)), "n": 0}, state, "adj")
    with pytest.raises(StateMismatchError, match=r"adj has keys 'v' where the state has 'u'"):
        check_seed({"v": np.ones(4), "params": 1.0, "n": 0}, state, "adj")
    with pytest.raises(StateMismatchError, match=r"adj\['params'\]\.c has shape \(3,\)"):
        check_seed({"u": np.ones(4), "params": Params(np.ones(3)), "n": 0}, state, "adj")
    with pytest.raises(StateMismatchError, match=r"adj\['n'\] has shape \(2,\), expected \(\)"):
        check_seed({"u": np.ones(4), "params": None, "n": np.zeros(2)}, state, "adj")


def test_the_signature_of_a_one_array_state_knows_it_is_one_array():
    assert signature(np.zeros(3)).array == (np.dtype(np.float64), (3,))
    assert signature([np.zeros(3)]).array is None


# -- leaf paths and the walk of a spec ---------------------------------------------------


def test_leaf_paths_name_every_leaf_as_flatten_names_it():
    state = {
        "u": np.zeros(2),
        "params": Params(np.ones(3)),
        "seq": [np.zeros(1), (np.zeros(1),)],
        (2, "x"): np.zeros(1),
        1: Point(np.zeros(1), 2),
    }
    leaves, spec = flatten(state)
    assert list(leaf_paths(spec).values()) == [
        "state['u']",
        "state['params'].c",
        "state['seq'][0]",
        "state['seq'][1][0]",
        "state[(2, 'x')]",
        "state[1][0]",
    ]
    assert Structure.of(state).paths() == list(leaf_paths(spec).values())
    kinds = [(kind, path) for kind, path, _ in spec_nodes(spec["tree"])]
    assert ("type", "state['params']") in kinds and ("value", "state['params'].rho") in kinds
    assert ("value", "state[1][1]") in kinds


def test_the_walk_of_a_spec_reads_untrusted_trees_without_failing():
    malformed = [
        None,
        [1, 2],
        {"dict": "ab", "items": 3},
        {"mapping": [{"tuple": 5}], "items": [{"leaf": 0}]},
        {"type": "x", "aux": None, "items": [{"leaf": "0"}]},
        {"list": [{"unknown": 1}]},
    ]
    for tree in malformed:
        list(spec_nodes(tree))
        leaf_paths({"tree": tree})
    assert leaf_paths({"tree": {"list": [{"leaf": 0}, {"leaf": "x"}]}}) == {0: "state[0]"}
    assert leaf_paths("not a spec") == {}
    deep: dict = {"leaf": 0}
    for _ in range(sys.getrecursionlimit() * 3):
        deep = {"list": [deep]}
    assert len(leaf_paths({"tree": deep})[0]) > sys.getrecursionlimit()


def test_the_comparison_of_trees_handles_malformed_and_json_specs():
    leaves, spec = flatten({"u": np.zeros(2), "t": 0.5})
    back = json.loads(json.dumps(spec))
    assert Structure.from_spec(back) == Structure.of({"u": np.ones(2), "t": 2.5})
    assert Structure.from_spec(back).matches({"u": np.ones(2), "t": 2.5})
    assert _layout.difference({"weird": 1}, [], {"weird": 2}, []) == "state differs in structure"
    with pytest.raises(ValueError, match="not a state spec"):
        Structure.from_spec({"tree": {}})
    with pytest.raises(UnknownStateTypeError, match="not registered"):
        Structure.from_spec(
            {"tree": {"type": "nowhere:Thing", "aux": None, "items": []}, "leaves": []}
        ).matches(1)


# -- the layout walk (the store's re-flatten) ------------------------------------------------


def test_a_layout_is_the_structure_of_a_state_whose_spec_has_no_values():
    state = {"u": np.zeros(3), "v": Params.__new__(Params)}
    assert Layout.of({"u": np.zeros(3), "w": [np.ones(2)]}).structure == Structure.of(
        {"u": np.ones(3), "w": [np.zeros(2)]}
    )
    assert Layout.of(np.zeros(3)).array == (np.dtype("<f8"), (3,))
    assert Layout.of([np.zeros(3)]).array is None
    for kind in ("scalars", "mapping", "user provider", "leaf provider", "nan"):
        assert Layout.of(KINDS[kind](1.0)) is None, kind
    assert Layout.of(np.zeros((3, 4)).T) is None  # flatten copies it: never re-flattened
    del state


def test_a_layout_takes_an_equal_dtype_built_anew_and_rebuilds_what_unflatten_does():
    fresh = np.dtype("<f8").newbyteorder("<")
    layout = Layout.of({"u": np.zeros(3), "p": Point(np.zeros(2), np.zeros(1))})
    state = {"u": np.ones(3, dtype=fresh), "p": Point(np.ones(2), np.ones(1))}
    leaves = layout.leaves(state)
    assert leaves is not None and leaves[0] is state["u"]
    assert layout.spec() == flatten(state)[1]
    rebuilt = layout.build([np.full(3, 2.0), np.full(2, 3.0), np.full(1, 4.0)])
    expected = unflatten(layout.spec(), [np.full(3, 2.0), np.full(2, 3.0), np.full(1, 4.0)])
    assert type(rebuilt["p"]) is Point and rebuilt["p"].x[0] == expected["p"].x[0] == 3.0
