"""The Tier contract as a test suite that any tier runs against itself.

zarr-python ships ``zarr.testing.store.StoreTests``, a class of tests that a
third-party store inherits to prove it behaves as the ``Store`` ABC says;
this module is the same for :class:`~vlcc_adjoint.storage.Tier`.  Every tier
of this package runs it (``tests/storage/test_tiers.py``: ``MemoryTier``,
``CompressedMemoryTier``, ``ZarrTier`` and the MPI ``SharedZarrTier`` on a
one-rank communicator); a new tier runs it with a few lines of pytest::

    import pytest
    from vlcc_adjoint.storage.testing import TierContract

    class TestMyTier(TierContract):
        @pytest.fixture
        def make_tier(self, tmp_path):
            def make(capacity_bytes=None):
                return MyTier(tmp_path / "tier", capacity_bytes)  # a new, empty tier
            return make

``make_tier(capacity_bytes)`` must return a new, empty tier each call (a
test may make several).  A subclass may override :meth:`TierContract.check`
to add invariants of its own (exact byte counts, files on disk), which the
random traces check after every operation, and may extend
:attr:`TierContract.states`.  The suite needs pytest and hypothesis (the
``test`` extra); importing this module imports them, so only tests import it.

What the suite pins down (the contract of :class:`~vlcc_adjoint.storage.Tier`):

* ``get`` returns the spec, leaf bytes (dtype, byte order and shape
  included) and checksums that ``put`` received, or raises; the spec it
  returns is the caller's to change.
* ``KeyError`` for a taken key on ``put`` and a missing one on ``get`` and
  ``delete``; ``ValueError`` for keys that could name a path outside a store
  and for specs that are not strict JSON; ``TypeError`` for what is not a
  :class:`~vlcc_adjoint.storage.Record`.  A refused ``put`` changes nothing.
* ``used_bytes <= capacity_bytes`` at all times, under random sequences of
  ``put``/``get``/``delete`` and under four threads at once; a ``put`` that
  does not fit raises :class:`~vlcc_adjoint.storage.TierFullError` and
  changes nothing; a ``delete`` gives the bytes back.
* A record whose leaves no longer match their checksums is never returned:
  ``get`` raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError`.
* The declared capabilities hold: ``serves_put_arrays`` only with
  ``retains_references``; ``fresh_gets`` arrays are new and writeable;
  ``reads_into`` tiers read into the arrays ``take`` gives.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ..state import flatten, unflatten
from ._checksum import make_record
from ._tier import CorruptCheckpointError, Record, Tier, TierFullError

__all__ = ["TierContract", "example_states"]

#: ``make_tier(capacity_bytes=None) -> Tier``: the fixture a suite subclass provides.
TierFactory = Callable[..., Tier]


def example_states() -> dict[str, Any]:
    """States covering what a tier must store exactly: dtypes of every kind and
    byte order, 0-d and empty arrays, nested structure, scalars and strings."""
    rng = np.random.default_rng(7)
    return {
        "array": rng.standard_normal((17, 5)),
        "dict": {
            "u": rng.standard_normal(300).astype(np.float32),
            "step": 12,
            "t": 0.25,
            "name": "wave",
            "flag": True,
            "nothing": None,
        },
        "dtypes": [
            np.arange(7, dtype=">i8"),
            np.array([True, False, True]),
            np.array([1 + 2j, -1j], np.complex64),
            np.arange(4, dtype=np.float16),
            np.array(["2020-01-01", "2024-02-29"], "M8[D]"),
            np.array([b"ab", b"cde"]),
            np.zeros(2, dtype=[("a", "<i4"), ("b", ">f8")]),
            np.arange(6, dtype=np.uint8),
        ],
        "shapes": (np.array(2.5), np.zeros((0, 3), np.float32), np.ones((2, 1, 3), np.int16)),
        "nested": {"a": [np.arange(3.0), {"b": (np.ones(2), "x")}], "c": 1e-300},
    }


def record_of(state: Any, step: int | None = None) -> Record:
    """A record of `state` (flattened), with ``spec["step"]`` when given."""
    leaves, spec = flatten(state)
    if step is not None:
        spec["step"] = step
    return make_record(spec, leaves)


def assert_same_record(got: Record, want: Record, where: str = "") -> None:
    """`got` has `want`'s spec, checksums and leaf bytes (dtype, shape, byte order)."""
    assert got.spec == want.spec, where
    assert tuple(got.checksums) == tuple(want.checksums), where
    assert len(got.leaves) == len(want.leaves), where
    for i, (a, b) in enumerate(zip(got.leaves, want.leaves)):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, i, a.dtype, b.dtype)
        assert a.tobytes() == b.tobytes(), (where, i)


class TierContract:
    """The Tier contract; subclass it and provide the ``make_tier`` fixture
    (see the module docstring)."""

    #: The states every round trip stores; a subclass may extend them.
    states: dict[str, Any] = example_states()
    #: Examples of the random put/get/delete traces (hypothesis).
    trace_examples: int = 25

    @pytest.fixture
    def make_tier(self) -> TierFactory:
        """``make_tier(capacity_bytes=None)``: a new, empty tier (subclasses provide it)."""
        raise NotImplementedError(
            "a TierContract subclass provides the make_tier fixture: "
            "make_tier(capacity_bytes=None) -> a new, empty tier"
        )

    def check(self, tier: Tier, model: dict[str, Record]) -> None:
        """Invariants after every operation of a trace; `model` maps the keys the
        tier holds to the records put.  Subclasses add their own (call super)."""
        used = tier.used_bytes
        assert used >= 0
        if tier.capacity_bytes is not None:
            assert used <= tier.capacity_bytes
            assert tier.free_bytes() == tier.capacity_bytes - used
        assert sorted(tier.keys()) == sorted(model)

    # -- round trips ---------------------------------------------------------------

    def test_every_state_round_trips(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        records = {}
        for i, (name, state) in enumerate(self.states.items()):
            key = f"s{i}"
            records[key] = record_of(state, step=i)
            tier.put(key, records[key])
            assert_same_record(tier.get(key), records[key], name)
        assert sorted(tier.keys()) == sorted(records)
        assert all(key in tier for key in records) and "absent" not in tier
        for key, rec in records.items():  # still intact after the others were written
            got = tier.get(key)
            assert_same_record(got, rec, key)
            unflatten(got.spec, got.leaves)
        tier.close()
        tier.close()  # idempotent

    def test_get_returns_the_spec_and_checksums_it_was_given(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        rec = record_of({"u": np.linspace(0, 1, 50), "t": 0.5}, step=12)
        rec.spec["meta"] = {"solver": "acoustic", "dt": 1e-3}
        want = copy.deepcopy(rec.spec)
        tier.put("a", rec)
        got = tier.get("a")
        assert got.spec == want and tuple(got.checksums) == tuple(rec.checksums)
        got.spec["meta"]["dt"] = 5.0  # the caller's copy: the tier is unaffected
        assert tier.get("a").spec == want

    def test_adopt_stores_like_put(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        rec = record_of({"u": np.arange(20.0)}, step=1)
        tier.adopt("a", rec)
        assert_same_record(tier.get("a"), rec)
        with pytest.raises(KeyError):
            tier.adopt("a", rec)

    # -- refusals ------------------------------------------------------------------

    def test_taken_and_missing_keys_raise_key_error(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        tier.put("a", record_of(np.ones(3)))
        with pytest.raises(KeyError, match="already"):
            tier.put("a", record_of(np.ones(3)))
        for op in (tier.get, tier.delete):
            with pytest.raises(KeyError):
                op("missing")
        tier.delete("a")
        assert "a" not in tier and tier.used_bytes == 0 and list(tier.keys()) == []
        with pytest.raises(KeyError):
            tier.get("a")

    @pytest.mark.parametrize(
        "key", ["../escape", "a/b", "/abs", ".hidden", "", "x" * 201, "a\\b", "a\x00b", "..", "c d"]
    )
    def test_keys_that_could_escape_the_store_are_rejected(
        self, make_tier: TierFactory, key: str
    ) -> None:
        tier = make_tier()
        with pytest.raises(ValueError, match="invalid record key"):
            tier.put(key, record_of(np.ones(2)))
        assert list(tier.keys()) == [] and tier.used_bytes == 0

    def test_specs_must_be_pure_json(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        leaves, spec = flatten(np.ones(2))
        spec["bad"] = float("nan")
        with pytest.raises(ValueError, match="pure JSON"):
            tier.put("a", make_record(spec, leaves))
        assert tier.used_bytes == 0 and list(tier.keys()) == []

    def test_only_records_are_stored(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        with pytest.raises(TypeError, match="Record"):
            not_a_record: Any = {"spec": {}, "leaves": [np.ones(2)]}
            tier.put("a", not_a_record)
        rec = record_of(np.ones(2))
        with pytest.raises(ValueError, match="checksum"):
            tier.put("a", Record(rec.spec, rec.leaves, ("not a checksum",)))
        assert tier.used_bytes == 0 and list(tier.keys()) == []

    def test_a_record_that_fails_its_checksums_is_never_returned(
        self, make_tier: TierFactory
    ) -> None:
        tier = make_tier()
        good = record_of({"u": np.arange(1000.0)}, step=5)
        forged = Record(good.spec, good.leaves, (record_of(np.zeros(1000)).checksums[0],))
        try:
            tier.put("a", forged)
        except CorruptCheckpointError:
            return  # refused at once: never stored
        with pytest.raises(CorruptCheckpointError):
            tier.get("a")

    # -- capacity --------------------------------------------------------------------

    def test_a_put_that_does_not_fit_raises_and_changes_nothing(
        self, make_tier: TierFactory
    ) -> None:
        rng = np.random.default_rng(1)
        probe = make_tier()
        probe.put("x", record_of(rng.standard_normal(1000)))
        one = probe.used_bytes
        assert one > 0
        tier = make_tier(capacity_bytes=int(2.5 * one))
        tier.put("a", record_of(rng.standard_normal(1000)))
        tier.put("b", record_of(rng.standard_normal(1000)))
        before = (sorted(tier.keys()), tier.used_bytes)
        with pytest.raises(TierFullError, match="capacity"):
            tier.put("c", record_of(rng.standard_normal(1000)))
        assert (sorted(tier.keys()), tier.used_bytes) == before
        assert "c" not in tier
        tier.delete("a")
        tier.put("c", record_of(rng.standard_normal(1000)))  # fits again
        assert tier.used_bytes <= int(2.5 * one)

    def test_capacity_and_contents_under_random_traces(self, make_tier: TierFactory) -> None:
        """Random put/get/delete sequences against a model, :meth:`check` after each."""
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        ops = st.lists(
            st.one_of(
                st.tuples(
                    st.just("put"),
                    st.integers(0, 300),
                    st.sampled_from(["<f8", ">i4", "|u1", "<c8"]),
                    st.integers(1, 3),
                    st.booleans(),
                ),
                st.tuples(st.just("get"), st.integers(0, 1000)),
                st.tuples(st.just("delete"), st.integers(0, 1000)),
            ),
            max_size=40,
        )

        @settings(
            max_examples=self.trace_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(capacity=st.integers(0, 6000), ops=ops)
        def trace(capacity: int, ops: list) -> None:
            tier = make_tier(capacity_bytes=capacity)
            model: dict[str, Record] = {}
            try:
                for counter, op in enumerate(ops):
                    if op[0] == "put":
                        _, n, dtype, nleaves, scalar = op
                        state: dict[str, Any] = {
                            f"x{i}": (np.arange(n + i) % 11).astype(dtype) for i in range(nleaves)
                        }
                        if scalar:
                            state["t"] = float(counter)
                        rec = record_of(state, step=counter)
                        before = (sorted(tier.keys()), tier.used_bytes)
                        try:
                            tier.put(f"k{counter}", rec)
                        except TierFullError:
                            assert (sorted(tier.keys()), tier.used_bytes) == before
                        else:
                            model[f"k{counter}"] = rec
                    elif model:
                        key = sorted(model)[op[1] % len(model)]
                        if op[0] == "get":
                            assert_same_record(tier.get(key), model[key], key)
                        else:
                            tier.delete(key)
                            del model[key]
                    self.check(tier, model)
            finally:
                tier.close()

        trace()

    def test_concurrent_puts_and_deletes_never_exceed_capacity(
        self, make_tier: TierFactory
    ) -> None:
        cap = 40_000
        tier = make_tier(capacity_bytes=cap)
        rng = np.random.default_rng(5)
        states = [rng.standard_normal(int(n)) for n in rng.integers(100, 1500, 16)]
        errors: list[BaseException] = []
        peak = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tier.used_bytes)

        def worker(w: int) -> None:
            try:
                for i in range(60):
                    key = f"w{w}-{i}"
                    state = states[(w + i) % len(states)]
                    try:
                        tier.put(key, record_of(state))
                    except TierFullError:
                        continue
                    np.testing.assert_array_equal(tier.get(key).leaves[0], state)
                    if i % 3:
                        tier.delete(key)
            except BaseException as err:  # reported below
                errors.append(err)

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
        assert not errors, errors
        assert peak[0] <= cap and tier.used_bytes <= cap
        for key in list(tier.keys()):
            tier.get(key)
            tier.delete(key)
        assert tier.used_bytes == 0

    # -- declared capabilities -------------------------------------------------------

    def test_declared_capabilities_hold(self, make_tier: TierFactory) -> None:
        tier = make_tier()
        leaf = np.arange(4096.0)
        rec = make_record({"step": 1}, [leaf])
        tier.put("a", rec)
        if tier.serves_put_arrays:
            assert tier.retains_references, "serves_put_arrays needs retains_references"
        if tier.reads_into:
            assert tier.fresh_gets, "reads_into needs fresh_gets"
        got = tier.get("a")
        if tier.fresh_gets:
            again = tier.get("a")
            assert got.leaves[0].flags.writeable
            assert not np.shares_memory(got.leaves[0], leaf)
            assert not np.shares_memory(got.leaves[0], again.leaves[0])
        if tier.reads_into:
            given: list[np.ndarray] = []

            def take(dtype: np.dtype, shape: tuple) -> np.ndarray:
                out = np.empty(shape, dtype)
                given.append(out)
                return out

            reader: Any = tier  # Tier.get declares no `take`; reads_into tiers take it
            into = reader.get("a", take=take)
            assert len(given) == 1 and into.leaves[0] is given[0]
            np.testing.assert_array_equal(into.leaves[0], leaf)
        if not (tier.fresh_gets or tier.retains_references):
            np.testing.assert_array_equal(got.leaves[0], leaf)
