"""State providers: flatten/unflatten rebuild every supported kind exactly,
specs are pure JSON that name nothing executable, dedup hashing and its table."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlcc_adjoint.state import (
    Layout,
    UnknownStateTypeError,
    dtype_from_json,
    dtype_to_json,
    flatten,
    leaf_digest,
    register,
    unflatten,
)
from vlcc_adjoint.storage._dedup import LeafTable

# -- a referee for "the same state" ----------------------------------------------


def assert_same_state(a, b, path="state"):
    """Same types, same structure, bit-identical arrays (dtype incl. byte order)."""
    jax = _jax()
    if jax is not None and isinstance(a, jax.Array):
        assert isinstance(b, jax.Array), f"{path}: {type(b)} is not a jax.Array"
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert b.dtype == a.dtype
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=a.dtype.kind in "fc"), path
        return
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.dtype.str == b.dtype.str, f"{path}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: {a.shape} != {b.shape}"
        assert a.tobytes() == b.tobytes(), f"{path}: values differ"
    elif isinstance(a, np.generic):
        assert a.dtype.str == b.dtype.str and a.tobytes() == b.tobytes(), path
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        ), path
    elif isinstance(a, complex):
        assert_same_state(a.real, b.real, path + ".real")
        assert_same_state(a.imag, b.imag, path + ".imag")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same_state(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}[{i}]")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same_state(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _jax():
    try:
        import jax
    except ImportError:  # pragma: no cover
        return None
    return jax


def round_trip(state, via_json=True):
    leaves, spec = flatten(state)
    if via_json:
        spec = json.loads(json.dumps(spec, allow_nan=False))
    return unflatten(spec, leaves)


# -- the kinds ----------------------------------------------------------------------


@dataclasses.dataclass
class Params:
    c: np.ndarray
    rho: float = 1.0
    name: str = "model"


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: tuple
    y: dict


Point = collections.namedtuple("Point", "x y")


def _states():
    rng = np.random.default_rng(0)
    return {
        "float64 2-D": rng.standard_normal((5, 7)),
        "big-endian": np.arange(6, dtype=">f8").reshape(2, 3),
        "big-endian int": np.arange(6, dtype=">i4"),
        "bool": np.array([True, False, True]),
        "complex": np.array([1 + 2j, np.nan + 1j], dtype=np.complex64),
        "float16": np.array([1.5, -0.0, np.inf], dtype=np.float16),
        "uint64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "0-d": np.array(3.25),
        "empty": np.zeros((0, 4), dtype=np.int16),
        "empty 1-d": np.array([], dtype=np.float32),
        "datetime": np.array(["2024-01-01T00:00", "NaT"], dtype="datetime64[m]"),
        "timedelta": np.array([1, 2], dtype="timedelta64[ns]"),
        "unicode": np.array(["ab", "cde"]),
        "bytes array": np.array([b"x", b"yz"]),
        "structured": np.zeros(3, dtype=[("a", "<f4"), ("b", ">i2", (2,))]),
        "python scalars": [None, True, False, 0, -7, 2**80, 1.5, -0.0, "text", "ünï", b"\x00\xff"],
        "nan inf": [float("nan"), float("inf"), float("-inf")],
        "complex python": [1 + 2j, complex(float("nan"), -0.0), complex(float("inf"), 1)],
        "numpy scalars": [
            np.float32(1.5),
            np.int8(-3),
            np.bool_(True),
            np.complex128(1j),
            np.float64("nan"),
            np.datetime64("2020-01-01"),
            np.str_("hi"),
            np.longdouble(1) / 3,
            np.uint16(7),
        ],
        "nested": {"a": [1, (2, {"b": np.ones(3)})], "c": ({"d": None},), "e": []},
        "non-str keys": {1: "one", (2, "x"): np.arange(2), None: 0.5, 2.5: [], False: "f"},
        "namedtuple": Point(np.ones(2), Point(1, "y")),
        "dataclass": Params(c=np.full((3, 3), 1500.0), rho=2.5),
        "frozen dataclass": Frozen(x=(1, np.int64(2)), y={"k": np.zeros(1)}),
        "empty containers": {"l": [], "t": (), "d": {}},
        "many leaves": [np.full(i, i, dtype=np.int32) for i in range(20)],
    }


STATES = _states()


@pytest.mark.parametrize("kind", list(STATES))
def test_flatten_then_unflatten_rebuilds_every_kind_exactly(kind):
    state = STATES[kind]
    assert_same_state(state, round_trip(state, via_json=False))
    assert_same_state(state, round_trip(state, via_json=True))


@pytest.mark.parametrize("kind", list(STATES))
def test_a_layout_reflattens_a_state_exactly_as_flatten_does(kind):
    state = STATES[kind]
    layout = Layout.of(state)
    leaves, spec = flatten(state)
    if layout is None:  # scalars, non-str keys, copies of non-contiguous arrays: not modelled
        return
    got = layout.leaves(state)
    assert got is not None and len(got) == len(leaves)
    assert all(a is b for a, b in zip(got, leaves))  # the state's own arrays, like flatten's
    assert layout.spec() == spec and json.loads(json.dumps(layout.spec())) == spec


@dataclasses.dataclass
class _Wave:
    prev: np.ndarray
    curr: np.ndarray


def test_a_layout_takes_only_states_of_its_structure_dtypes_and_shapes():
    def wave(n=4, dtype=np.float64):
        return _Wave(np.zeros(n, dtype), np.ones(n, dtype))

    modelled = [
        np.zeros(3),
        wave(),
        (np.zeros(2), [np.ones(3)]),
        {"u": np.zeros(2), "v": wave()},
        Point(np.zeros(1), np.ones(2)),
    ]
    for state in modelled:
        assert Layout.of(state) is not None, state
    layout = Layout.of(wave())
    assert layout.leaves(wave()) is not None and layout.nbytes == 64
    for other in (
        wave(5),
        wave(dtype=np.float32),
        _Wave(np.zeros(8)[::2], np.ones(4)),
        (np.zeros(4), np.ones(4)),
        Point(np.zeros(4), np.ones(4)),
        _Wave(np.zeros(4), [1.0, 2.0, 3.0, 4.0]),
        np.zeros(4),
    ):
        assert layout.leaves(other) is None, other
    layout = Layout.of({"u": np.zeros(2), "v": np.zeros(2)})
    assert layout.leaves({"v": np.zeros(2), "u": np.zeros(2)}) is None  # key order is structure
    assert layout.leaves({"u": np.zeros(2), "v": np.zeros(2), "w": np.zeros(2)}) is None
    assert layout.leaves({"u": np.zeros(2)}) is None
    layout = Layout.of([np.zeros(2)])
    assert layout.leaves((np.zeros(2),)) is None and layout.leaves([np.zeros(2)] * 2) is None
    # Values that are not arrays are part of the spec: such states have no layout.
    assert Layout.of({"u": np.zeros(2), "t": 0.5}) is None
    assert Layout.of(Params(c=np.zeros(2), rho=2.5)) is None


@pytest.mark.parametrize("kind", list(STATES))
def test_spec_is_strict_json_and_leaves_are_c_contiguous_arrays(kind):
    leaves, spec = flatten(STATES[kind])
    text = json.dumps(spec, allow_nan=False)  # no NaN/Infinity tokens, nothing non-JSON
    assert json.loads(text) == spec
    for leaf in leaves:
        assert type(leaf) is np.ndarray and leaf.flags.c_contiguous
    assert [entry["shape"] for entry in spec["leaves"]] == [list(x.shape) for x in leaves]


def test_contiguous_leaves_are_views_and_non_contiguous_ones_copied_to_c_order():
    u = np.arange(24.0).reshape(4, 6)
    fortran = np.asfortranarray(u)
    strided = u[:, ::2]
    leaves, spec = flatten({"u": u, "f": fortran, "s": strided})
    assert leaves[0] is u  # no copy
    for leaf, src in zip(leaves[1:], (fortran, strided)):
        assert leaf.flags.c_contiguous and not np.shares_memory(leaf, src)
        assert np.array_equal(leaf, src)
    rebuilt = unflatten(spec, leaves)
    assert np.array_equal(rebuilt["s"], strided)


def test_unflatten_copy_gives_writable_arrays_the_state_owns():
    u = np.arange(4.0)
    leaves, spec = flatten({"u": u})
    ro = leaves[0].view()
    ro.flags.writeable = False
    state = unflatten(spec, [ro], copy=True)
    state["u"][0] = 99.0
    assert u[0] == 0.0


def test_python_bool_int_and_float_keep_their_types():
    state = [True, 1, 1.0, np.True_, np.int64(1), np.float64(1.0)]
    out = round_trip(state)
    assert [type(x) for x in out] == [type(x) for x in state]


def test_dataclass_registered_by_flatten_and_rebuilt_with_its_constructor():
    calls = []

    @dataclasses.dataclass
    class WithPost:
        x: np.ndarray
        derived: float = dataclasses.field(init=False, default=0.0)

        def __post_init__(self):
            calls.append(1)
            self.derived = float(self.x.sum())

    out = round_trip(WithPost(np.ones(3)))
    assert out.derived == 3.0 and len(calls) == 2


def test_register_user_type_with_json_aux():
    class Grid:
        def __init__(self, values, spacing):
            self.values, self.spacing = values, spacing

    register(
        Grid,
        lambda g: ([g.values], {"spacing": (g.spacing, g.spacing)}),
        lambda aux, ch: Grid(ch[0], aux["spacing"][0]),
        name="test:Grid",
    )
    leaves, spec = flatten({"g": Grid(np.ones((2, 2)), 0.1)})
    assert spec["tree"]["items"][0]["type"] == "test:Grid"
    out = unflatten(json.loads(json.dumps(spec)), leaves)
    assert isinstance(out["g"], Grid) and out["g"].spacing == 0.1
    assert np.array_equal(out["g"].values, np.ones((2, 2)))


def test_register_rejects_non_json_aux_with_remedy():
    class Bad:
        pass

    register(Bad, lambda b: ([], {"f": print}), lambda aux, ch: Bad(), name="test:Bad")
    with pytest.raises(TypeError, match="aux data .* not JSON-serialisable"):
        flatten([Bad()])


def test_spec_naming_an_unregistered_type_is_refused_without_importing_it(monkeypatch):
    import builtins

    imported = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    spec = {
        "format": "vlcc-state/1",
        "leaves": [],
        "tree": {"type": "os:system", "aux": "echo pwned", "items": []},
    }
    monkeypatch.setattr(builtins, "__import__", spy)
    with pytest.raises(UnknownStateTypeError, match="register"):
        unflatten(spec, [])
    assert "os" not in imported


def test_unknown_type_error_names_the_path_and_the_remedy():
    with pytest.raises(UnknownStateTypeError, match=r"state\['a'\]\[1\]\['b'\].*register"):
        flatten({"a": [1, {"b": object()}]})
    with pytest.raises(UnknownStateTypeError, match=r"state\.c: .*callables"):
        flatten(Params(c=lambda: 0))


def test_object_arrays_are_refused_with_the_remedy():
    with pytest.raises(TypeError, match=r"state\['x'\].*objects.*convert"):
        flatten({"x": np.array([1, "a", None], dtype=object)})


def test_array_subclasses_are_refused_except_memmap(tmp_path):
    with pytest.raises(UnknownStateTypeError, match="mask"):
        flatten(np.ma.masked_array([1.0, 2.0], mask=[0, 1]))
    mm = np.memmap(tmp_path / "m.dat", dtype=np.float32, mode="w+", shape=(4,))
    mm[:] = 2.0
    out = round_trip({"m": mm})
    assert type(out["m"]) is np.ndarray and np.array_equal(out["m"], np.full(4, 2.0, np.float32))


def test_dict_keys_must_be_json_scalars_or_tuples():
    with pytest.raises(TypeError, match="dict keys"):
        flatten({frozenset(): 1})


def test_unflatten_rejects_leaves_that_do_not_match_the_spec():
    leaves, spec = flatten({"u": np.zeros(3)})
    with pytest.raises(ValueError, match="leaf 0"):
        unflatten(spec, [np.zeros(4)])
    with pytest.raises(ValueError, match="leaf 0"):
        unflatten(spec, [np.zeros(3, dtype=">f8")])  # byte order is part of the dtype
    with pytest.raises(ValueError, match="leaves"):
        unflatten(spec, [])


@pytest.mark.parametrize(
    "bad",
    [
        "O",
        "|O",
        "object",
        "<f8,<i4",
        "float64",
        "os.system",
        {"x": 1},
        {"descr": [["a", "|O"]]},
        {"descr": [["a", "<f8"], ["a", "<f8"]]},
        "<b8",
        "<f3",
        5,
        None,
    ],
)
def test_dtype_from_json_refuses_anything_outside_the_allow_list(bad):
    with pytest.raises(ValueError):
        dtype_from_json(bad)


@pytest.mark.parametrize(
    "dtype",
    [
        "<f8",
        ">f4",
        "|b1",
        "<c16",
        "<M8[ns]",
        "<m8",
        "<U5",
        "|S3",
        "|V4",
        [("a", "<f4"), ("b", ">i2", (2,))],
    ],
)
def test_dtype_json_round_trips(dtype):
    dt = np.dtype(dtype)
    js = json.loads(json.dumps(dtype_to_json(dt)))
    assert dtype_from_json(js) == dt and dtype_from_json(js).str == dt.str


# -- JAX --------------------------------------------------------------------------


def test_jax_arrays_round_trip_as_jax_arrays_inside_containers():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    state = {
        "u": jnp.arange(6.0).reshape(2, 3),
        "l": [jnp.ones(2, dtype=jnp.int32)],
        "p": Params(c=jnp.zeros((2, 2))),
        "bf": jnp.ones(3, dtype=jnp.bfloat16),
        "key": jax.random.key(7),
        "raw_key": jax.random.PRNGKey(3),
    }
    out = round_trip(state)
    assert_same_state(state, out)
    assert out["bf"].dtype == jnp.bfloat16
    assert jax.random.uniform(out["key"]) == jax.random.uniform(state["key"])


def test_equinox_module_round_trips_without_calling_its_init():
    jax = pytest.importorskip("jax")
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(3, 2, width_size=4, depth=1, key=jax.random.key(0), activation=jax.nn.relu)
    params, static = eqx.partition(model, eqx.is_array)
    with pytest.raises(UnknownStateTypeError, match="eqx.partition"):
        flatten(model)  # holds functions (the activations)
    linear = eqx.nn.Linear(3, 2, key=jax.random.key(1))
    out = round_trip({"linear": linear})["linear"]
    x = jax.numpy.ones(3)
    assert type(out) is type(linear) and np.array_equal(out(x), linear(x))
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(linear)
    del params, static


# -- property: random nests --------------------------------------------------------

_arrays = st.sampled_from(["<f8", ">f8", "<i4", "|b1", "<c8", "|u1"]).flatmap(
    lambda dt: st.lists(st.integers(0, 3), max_size=3).map(
        lambda shape: (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dt).reshape(shape)
    )
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.complex_numbers(),
    st.text(max_size=5),
    st.binary(max_size=4),
)
_states_strategy = st.recursive(
    st.one_of(_scalars, _arrays),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), children, max_size=4),
        st.builds(Point, children, children),
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_states_strategy)
def test_random_nested_states_round_trip_through_json_specs(state):
    assert_same_state(state, round_trip(state))


# -- content hashing and the dedup table ------------------------------------------


def test_leaf_digest_depends_on_bytes_dtype_byte_order_and_shape():
    a = np.arange(12.0)
    base = leaf_digest(a)
    assert leaf_digest(a.copy()) == base and len(base) == 32
    assert leaf_digest(a.reshape(3, 4)) != base
    assert leaf_digest(a.astype(">f8")) != base
    assert leaf_digest(a.view(np.int64)) != base
    b = a.copy()
    b[5] = np.nextafter(b[5], 100)
    assert leaf_digest(b) != base
    assert leaf_digest(np.asfortranarray(a.reshape(3, 4))) == leaf_digest(a.reshape(3, 4))


def test_leaf_table_stores_a_shared_leaf_once_and_frees_it_with_its_last_reference():
    table = LeafTable()
    model = np.ones((100, 100))
    digest, stored = table.put_leaf(model)
    assert stored is model and table.refcount(digest) == 1
    again = table.put(digest, model.copy())
    assert again is model and table.refcount(digest) == 2
    assert table.acquire(digest) is model and table.refcount(digest) == 3
    assert table.nbytes == model.nbytes and table.referenced_bytes == 3 * model.nbytes
    assert table.acquire("0" * 32) is None
    assert table.release(digest) is False and table.release(digest) is False
    assert table.release(digest) is True
    assert digest not in table and table.nbytes == 0 and table.referenced_bytes == 0
    with pytest.raises(KeyError):
        table.release(digest)


def test_leaf_table_refuses_a_digest_reused_for_another_shape():
    table = LeafTable()
    digest, _ = table.put_leaf(np.zeros(4))
    with pytest.raises(ValueError, match="leaf_digest"):
        table.put(digest, np.zeros(5))


def test_leaf_table_refcounts_are_exact_under_concurrent_use():
    table = LeafTable()
    leaf = np.zeros(1000)
    digest = leaf_digest(leaf)
    table.put(digest, leaf)

    def worker():
        for _ in range(2000):
            assert table.acquire(digest) is leaf
            table.release(digest)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert table.refcount(digest) == 1 and table.nbytes == leaf.nbytes


def test_a_spec_cannot_set_attributes_a_dataclass_does_not_have():
    leaves, spec = flatten(Params(c=np.ones(2)))
    spec["tree"]["aux"][0] = "__class__"
    with pytest.raises(ValueError, match="does not have"):
        unflatten(spec, leaves)
