"""``checkpointed_scan``'s options in combination, against ``jax.lax.scan``.

The options (``schedule`` / ``snapshots``, ``segment``, ``store`` in its
planned form and in the deprecated one (host tiers, no plan), ``xs=None``
with ``length``, ``length`` given or read from ``xs``, ``reverse``,
``unroll``, pytree or empty outputs) and the
transformations around the scan (``jax.grad``, ``jax.jit``, ``jax.vmap``)
are tested here together: every *pair* of choices appears in at least one
case (a covering array built greedily, Cohen et al., "The AETG system",
IEEE TSE 23(7), 1997), each case comparing the value and the gradients with
respect to the parameters, the initial carry and ``xs`` with those of plain
``lax.scan`` in float64 to rtol 1e-10.  Pairs that cannot work (a host
level under ``jax.vmap``; ``segment="auto"`` with a given schedule;
``xs=None`` without ``length``) are
tested to raise a :class:`~vlcc_adjoint.errors.VlccError` naming the
option and the fix.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from vlcc_adjoint.errors import VlccError  # noqa: E402
from vlcc_adjoint.jax import checkpointed_scan  # noqa: E402
from vlcc_adjoint.schedules import Level, Multistage, Revolve, io_plan, simulate  # noqa: E402
from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore  # noqa: E402

pytestmark = pytest.mark.usefixtures("x64")

N = 13  # steps: with segment=3, four segments and a one-step tail
BATCH = 2

FACTORS = {
    "plan": ["snapshots", "schedule", "default", "host", "legacy"],
    "segment": [1, 3, "auto"],
    "xs": ["pytree", "none"],
    "length": ["given", "inferred"],
    "reverse": [False, True],
    "unroll": [1, 2, True],
    "ys": ["pytree", "none"],
    "transform": ["grad", "jit-grad", "vmap-grad", "grad-vmap"],
}


def _refused(case: dict) -> str | None:
    """Why `case` cannot work ("" when it can): the error it must raise."""
    if case["plan"] in ("schedule", "host", "legacy") and case["segment"] == "auto":
        return "segment=B, an int"
    if case["plan"] in ("host", "legacy") and "vmap" in case["transform"]:
        return "cannot run under jax.vmap"
    if case["xs"] == "none" and case["length"] == "inferred":
        return "with xs=None give `length`"
    return None


def _covering(factors: dict, allowed) -> list[dict]:
    """A small list of cases, all `allowed`, in which every pair of values
    of two factors that some allowed case holds appears at least once
    (greedy: each new case covers the most pairs not yet covered; the first
    such case in product order, so the list is the same on every run)."""
    names = list(factors)
    combos = [
        dict(zip(names, values))
        for values in itertools.product(*factors.values())
        if allowed(dict(zip(names, values)))
    ]

    def pairs(case):
        return {(a, repr(case[a]), b, repr(case[b])) for a, b in itertools.combinations(names, 2)}

    uncovered = set().union(*(pairs(c) for c in combos))
    cases = []
    while uncovered:
        best = max(combos, key=lambda c: len(pairs(c) & uncovered))
        cases.append(best)
        uncovered -= pairs(best)
    return cases


CASES = _covering(FACTORS, lambda c: _refused(c) is None)


def _schedule(case: dict) -> dict:
    """The ``schedule`` / ``snapshots`` / ``store`` options of `case`."""
    steps = N // case["segment"] if isinstance(case["segment"], int) else N
    if case["plan"] == "snapshots":
        return {"snapshots": 3}
    if case["plan"] == "schedule":
        return {"schedule": Revolve(steps, 2)}
    if case["plan"] == "host":
        schedule = Multistage(steps, [Level(1, 0.0, 0.0), Level(2, 0.5, 0.5)])
        assert simulate(schedule).writes[1] > 0  # the case does reach the host level
        store = TieredStore([DeviceTier(), MemoryTier()], plan=io_plan(schedule))
        return {"schedule": schedule, "store": store}
    if case["plan"] == "legacy":  # the deprecated form: host tiers, no plan, tier k - 1 = level k
        schedule = Multistage(steps, [Level(1, 0.0, 0.0), Level(2, 0.5, 0.5)])
        return {"schedule": schedule, "store": TieredStore([MemoryTier()])}
    return {}


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {
        "W": jnp.asarray(rng.standard_normal((3, 3)) * 0.5),
        "b": jnp.asarray(rng.standard_normal(3) * 0.1),
    }
    u0 = jnp.asarray(rng.standard_normal((BATCH, 3)))
    xs = {"a": jnp.asarray(rng.standard_normal((N, 3))), "s": jnp.asarray(rng.standard_normal(N))}
    return params, u0, xs


def _loss(scan, case: dict):
    """A loss of `(params, u0, xs)` through `scan` with a pytree carry (two
    float arrays and an int counter), pytree or empty inputs and outputs."""

    def loss(params, u0, xs):
        def f(c, x):
            a, s = (x["a"], x["s"]) if x is not None else (jnp.cos(c["u"]), jnp.sin(c["u"][0]))
            u = jnp.tanh(params["W"] @ c["u"] + a + params["b"] * s)
            v = (c["v"][0] * jnp.cos(s) + jnp.sum(u) * 0.1,)
            carry = {"u": u, "v": v, "k": c["k"] + 1}
            ys = None if case["ys"] == "none" else {"norm": jnp.sum(u**2), "pair": (u[0], c["k"])}
            return carry, ys

        init = {"u": u0, "v": (u0[:2] * 0.5,), "k": jnp.asarray(0, jnp.int32)}
        scan_xs = xs if case["xs"] == "pytree" else None
        c, ys = scan(f, init, scan_xs)
        out = jnp.sum(c["u"] ** 3) + jnp.sum(jnp.sin(c["v"][0])) + 0.0 * c["k"]
        if ys is not None:
            out = out + jnp.sum(ys["norm"]) + jnp.sum(jnp.cos(ys["pair"][0]))
        return out

    return loss


def _transformed(loss, transform: str):
    """`loss(params, u0, xs)` (``u0`` a batch of initial carries) as the
    value and gradients of the case's transformation."""
    argnums = (0, 1, 2)
    if transform in ("grad", "jit-grad"):
        # Each carry of the batch alone, one after the other.
        def value_and_grad(params, u0, xs):
            return [jax.value_and_grad(loss, argnums)(params, u, xs) for u in u0]

        return jax.jit(value_and_grad) if transform == "jit-grad" else value_and_grad
    if transform == "vmap-grad":
        return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums), in_axes=(None, 0, None)))

    def batched(params, u0, xs):
        return jnp.sum(jax.vmap(loss, in_axes=(None, 0, None))(params, u0, xs))

    return jax.jit(jax.value_and_grad(batched, argnums))


def _close(got, ref):
    assert jax.tree.structure(got) == jax.tree.structure(ref)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def _ours(case: dict):
    options = _schedule(case)

    length = {"length": N} if case["length"] == "given" else {}

    def scan(f, init, xs):
        return checkpointed_scan(
            f,
            init,
            xs,
            **length,
            reverse=case["reverse"],
            unroll=case["unroll"],
            segment=case["segment"],
            **options,
        )

    return scan, options.get("store")


def _plain(case: dict):
    def scan(f, init, xs):
        return lax.scan(f, init, xs, length=N, reverse=case["reverse"])

    return scan


def test_the_cases_cover_every_allowed_pair():
    assert 16 <= len(CASES) <= 30  # plan x transform alone needs 16 (four refused pairs)
    for case in CASES:
        assert _refused(case) is None


@pytest.mark.parametrize(
    "case", CASES, ids=["-".join(f"{k}={v}" for k, v in c.items()) for c in CASES]
)
def test_options_in_combination_equal_lax_scan(case):
    args = _data()
    ref = _transformed(_loss(_plain(case), case), case["transform"])(*args)
    scan, store = _ours(case)
    if case["plan"] == "legacy":
        with pytest.warns(DeprecationWarning, match=r"TieredStore\(\[DeviceTier\(\), MemoryTier"):
            got = _transformed(_loss(scan, case), case["transform"])(*args)
    else:
        got = _transformed(_loss(scan, case), case["transform"])(*args)
    _close(got, ref)
    if store is not None:  # every record deleted by the schedule, on every level
        assert all(store.steps(k) == [] for k in range(len(store.tiers)))
        store.close()


@pytest.mark.parametrize(
    "case",
    [
        dict(plan="schedule", segment="auto", transform="grad"),
        dict(plan="host", segment="auto", transform="grad"),
        dict(plan="host", segment=1, transform="vmap-grad"),
        dict(plan="host", segment=3, transform="grad-vmap"),
        dict(plan="legacy", segment="auto", transform="grad"),
        dict(plan="legacy", segment=1, transform="grad-vmap"),
        dict(plan="default", segment=3, xs="none", length="inferred", transform="grad"),
    ],
    ids=repr,
)
def test_combinations_that_cannot_work_name_the_option_and_the_fix(case):
    case = {**dict(xs="pytree", length="given", reverse=False, unroll=1, ys="pytree"), **case}
    why = _refused(case)
    assert why
    scan, store = _ours(case)
    with pytest.raises(VlccError, match=why):
        _transformed(_loss(scan, case), case["transform"])(*_data())
    if store is not None:
        store.close()


def test_xs_none_with_length_and_auto_segments_under_grad():
    """The call of issue 30: ``xs=None``, ``length`` and ``segment="auto"``
    under ``jax.grad`` (it raised ``TypeError: unflatten()`` from inside)."""

    def loss(scan):
        def run(w, u0):
            c, ys = scan(lambda c, _: (jnp.sin(w * c) * 0.9 + 0.1, c), u0, None, length=100)
            return jnp.sum(c) + jnp.sum(ys)

        return jax.value_and_grad(run, argnums=(0, 1))

    args = (jnp.asarray(0.8), jnp.linspace(0.0, 1.0, 3))
    got = loss(lambda *a, **k: checkpointed_scan(*a, **k, snapshots=10, segment="auto"))(*args)
    _close(got, loss(lax.scan)(*args))


def test_unroll_must_be_a_bool_or_a_non_negative_int():
    f = lambda c, x: (c + x, c)  # noqa: E731
    xs = jnp.ones(4)
    for unroll in (0, True):  # fully, as lax.scan
        _close(checkpointed_scan(f, 0.0, xs, unroll=unroll), lax.scan(f, 0.0, xs, unroll=unroll))
    with pytest.raises(VlccError, match="non-negative"):
        checkpointed_scan(f, 0.0, xs, unroll=-1)
    with pytest.raises(VlccError, match="`unroll` must be an int"):
        checkpointed_scan(f, 0.0, xs, unroll=1.5)


def test_a_schedule_of_the_wrong_type_is_named_before_the_segment_reads_it():
    f = lambda c, x: (c + x, c)  # noqa: E731
    with pytest.raises(VlccError, match="must be a vlcc_adjoint.schedules.Schedule"):
        checkpointed_scan(f, 0.0, jnp.ones(6), schedule=[1, 2], segment=2)
    with pytest.raises(VlccError, match="not both"):
        checkpointed_scan(f, 0.0, jnp.ones(6), schedule=Revolve(3, 1), snapshots=2, segment=2)


def _keyed_loss(scan):
    """A loss of `w` through `scan` whose carry holds a typed PRNG key."""

    def step(c, x):
        key, u = c
        key, sub = jax.random.split(key)
        return (key, jnp.tanh(u * x) + 0.1 * jax.random.normal(sub, u.shape)), jnp.sum(u)

    def loss(w):
        (key, u), ys = scan(step, (jax.random.key(0), w * jnp.ones(3)), jnp.linspace(0.5, 1.0, N))
        return jnp.sum(u**2) + jnp.sum(ys) + 0.0 * jnp.sum(jax.random.key_data(key))

    return jax.value_and_grad(loss)


@pytest.mark.parametrize("plan", ["snapshots", "auto-segments", "host", "legacy"])
def test_a_prng_key_in_the_carry(plan):
    """Typed PRNG keys have no numpy dtype: the automatic segment's byte
    count and the host levels' callbacks use their key data (both raised
    ``TypeError: Cannot interpret 'key<fry>' as a data type``)."""
    options = {"snapshots": 3} if plan == "snapshots" else {"segment": "auto"}
    if plan in ("host", "legacy"):
        options = _schedule({"plan": plan, "segment": 1})
    ref = _keyed_loss(lax.scan)(0.7)
    scan = lambda f, c, xs: checkpointed_scan(f, c, xs, **options)  # noqa: E731
    if plan == "legacy":
        with pytest.warns(DeprecationWarning, match="is deprecated"):
            got = _keyed_loss(scan)(0.7)
    else:
        got = _keyed_loss(scan)(0.7)
    _close(got, ref)
    if "store" in options:
        assert all(options["store"].steps(k) == [] for k in range(len(options["store"].tiers)))
        assert options["store"].stats().saves > 0  # the keys did reach a host level
        options["store"].close()


@pytest.mark.parametrize("segment", [1, 2, "auto"])
def test_forward_mode_through_the_closure_alone(segment):
    """``jax.jvp`` of a parameter the step closes over, the initial carry a
    constant (the forward-mode check saw only the carry and ``xs``: JAX
    refused ``jvp`` of the custom_vjp)."""

    def run(scan):
        def value(w):
            return scan(lambda c, _: (jnp.sin(w * c) + 0.1, c), 1.0, None, length=N)[0]

        return jax.jvp(value, (0.7,), (1.0,))

    got = run(lambda *a, **k: checkpointed_scan(*a, **k, snapshots=3, segment=segment))
    _close(got, run(lax.scan))
