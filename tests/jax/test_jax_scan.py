"""``vlcc_adjoint.jax.checkpointed_scan`` against ``jax.lax.scan``.

Referees: values and gradients of plain ``lax.scan`` (float64, rtol 1e-10;
float32, rtol 1e-5), central finite differences, :func:`table_trace` (the
rules of ``schedules/actions.py`` expanded from the table) and
:func:`simulate`.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from vlcc_adjoint.jax import (  # noqa: E402
    checkpointed,
    checkpointed_fori_loop,
    checkpointed_scan,
    compile_program,
    jax_trace,
)
from vlcc_adjoint.schedules import (  # noqa: E402
    InvalidScheduleError,
    Level,
    Multistage,
    Online,
    Periodic,
    Revolve,
    StoreAll,
    simulate,
    table_trace,
)


def _close(a, b, rtol=1e-10, atol=1e-12):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if np.asarray(y).dtype == jax.dtypes.float0:  # gradient of an int leaf
            assert np.asarray(x).dtype == jax.dtypes.float0 and np.shape(x) == np.shape(y)
            continue
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# A step with a pytree carry (dict of two arrays + an int counter), pytree xs
# and pytree ys, closing over parameters.


def _problem(n, dtype=np.float64, seed=0):
    rng = np.random.RandomState(seed)
    params = {
        "W": jnp.asarray(rng.randn(4, 4) * 0.4, dtype),
        "b": jnp.asarray(rng.randn(4) * 0.1, dtype),
    }
    init = {
        "u": jnp.asarray(rng.randn(4), dtype),
        "v": jnp.asarray(rng.randn(2, 3), dtype),
        "k": jnp.asarray(0, jnp.int32),
    }
    xs = (jnp.asarray(rng.randn(n, 4), dtype), {"s": jnp.asarray(rng.randn(n), dtype)})
    return params, init, xs


def _make_loss(scan):
    def loss(params, init, xs):
        def f(c, x):
            a, d = x
            u = jnp.tanh(params["W"] @ c["u"] + a + params["b"] * d["s"])
            v = c["v"] * jnp.cos(d["s"]) + jnp.sum(u) * 0.1
            y = {"norm": jnp.sum(u**2), "first": (u[0], c["k"])}
            return {"u": u, "v": v, "k": c["k"] + 1}, y

        c, ys = scan(f, init, xs)
        return (
            jnp.sum(c["u"] ** 3)
            + jnp.sum(jnp.sin(c["v"]))
            + jnp.sum(ys["norm"] * 0.3)
            + jnp.sum(jnp.cos(ys["first"][0]))
            + 0.0 * c["k"]
        )

    return loss


def _plain(f, init, xs):
    return lax.scan(f, init, xs)


def _ours(**options):
    return lambda f, init, xs: checkpointed_scan(f, init, xs, **options)


SCHEDULES = {
    "revolve-3": lambda n: Revolve(n, 3),
    "revolve-1": lambda n: Revolve(n, 1),
    "revolve-2": lambda n: Revolve(n, 2),
    "revolve-n-1": lambda n: Revolve(n, max(n - 1, 1)),
    "revolve-n": lambda n: Revolve(n, n),
    "revolve-2n": lambda n: Revolve(n, 2 * n),
    "storeall": lambda n: StoreAll(n),
    "periodic": lambda n: Periodic(n, 3),
    "online": lambda n: Online(n, snapshots=3),
    "online-1": lambda n: Online(n, snapshots=1),
    "multistage": lambda n: Multistage(n, [Level(3)]),
}
# Every schedule at n = 7; the edge cases n = 1, 2 and a longer n = 23 for a
# few (each case is one XLA compile, ~1.5 s on two shared cores).
GRID = (
    [(7, name) for name in SCHEDULES]
    + [(1, "revolve-1"), (1, "storeall"), (1, "online"), (2, "revolve-1"), (2, "revolve-n")]
    + [(23, "revolve-3"), (23, "periodic"), (23, "online"), (23, "multistage")]
)

_reference_cache = {}


def _reference(n):
    if n not in _reference_cache:
        grad = jax.jit(jax.value_and_grad(_make_loss(_plain), argnums=(0, 1, 2), allow_int=True))
        _reference_cache[n] = jax.device_get(grad(*_problem(n)))
    return _reference_cache[n]


@pytest.mark.parametrize("n,name", GRID, ids=[f"{name}-n{n}" for n, name in GRID])
def test_gradients_equal_plain_scan_float64(x64, n, name):
    ref_val, ref = _reference(n)
    grad = jax.jit(
        jax.value_and_grad(
            _make_loss(_ours(schedule=SCHEDULES[name](n))), argnums=(0, 1, 2), allow_int=True
        )
    )
    val, got = grad(*_problem(n))
    _close(val, ref_val)
    _close(got, ref)


def test_values_equal_plain_scan_pytrees(x64):
    params, init, xs = _problem(17)

    def f(c, x):
        u = jnp.tanh(params["W"] @ c["u"] + x[0])
        return {**c, "u": u, "k": c["k"] + 1}, {"u": u, "k": c["k"]}

    ref = lax.scan(f, init, xs)
    for schedule in (Revolve(17, 4), Online(17, snapshots=4), Periodic(17, 5)):
        got = checkpointed_scan(f, init, xs, schedule=schedule)
        assert jax.tree.structure(got) == jax.tree.structure(ref)
        _close(got, ref, rtol=0, atol=0)
        assert got[1]["k"].dtype == jnp.int32


def test_float32_gradients_within_1e_5():
    params, init, xs = _problem(40, np.float32)
    ref = jax.jit(jax.grad(_make_loss(_plain), argnums=(0, 1, 2), allow_int=True))(params, init, xs)
    for snapshots in (2, 39):
        got = jax.jit(
            jax.grad(_make_loss(_ours(snapshots=snapshots)), argnums=(0, 1, 2), allow_int=True)
        )(params, init, xs)
        _close(got, ref, rtol=1e-5, atol=1e-6)


def test_default_snapshots_and_none_xs(x64):
    w = jnp.asarray(0.9)

    def loss(w, u0, scan):
        c, ys = scan(lambda c, _: (jnp.sin(w * c), c), u0, None, length=50)
        return jnp.sum(c) + jnp.sum(ys)

    ref = jax.grad(loss, argnums=(0, 1))(w, jnp.ones(3), lax.scan)
    got = jax.grad(loss, argnums=(0, 1))(w, jnp.ones(3), checkpointed_scan)
    _close(got, ref)


def test_only_ys_or_only_carry_cotangents(x64):
    params, init, xs = _problem(12)

    def run(scan, use):
        def loss(p):
            def f(c, x):
                u = jnp.tanh(p["W"] @ c + x[0])
                return u, jnp.sum(u)

            c, ys = scan(f, init["u"], xs)
            return {"carry": jnp.sum(c), "ys": jnp.sum(ys**2)}[use]

        return jax.jit(jax.grad(loss))(params)

    for use in ("carry", "ys"):
        _close(run(_ours(snapshots=3), use), run(_plain, use))


def test_gradient_wrt_xs_only_and_params_only(x64):
    _, ref = _reference(23)
    loss = _make_loss(_ours(snapshots=4))
    for argnums in (0, 2):
        got = jax.jit(jax.grad(loss, argnums=argnums))(*_problem(23))
        _close(got, ref[argnums])


def test_inside_jit_with_closure_and_int_constants(x64):
    params, init, xs = _problem(20)
    offsets = jnp.arange(4)  # an int array closed over inside jit: not differentiated

    @jax.jit
    def loss(p, u0, scan_flag):
        def f(c, x):
            return jnp.tanh(p["W"] @ c + x[0] + offsets), c[0]

        scan = checkpointed_scan if scan_flag is None else lax.scan
        c, ys = scan(f, u0, xs)
        return jnp.sum(c**2) + jnp.sum(ys)

    g_ref = jax.grad(loss, argnums=(0, 1))(params, init["u"], 0)
    g = jax.grad(loss, argnums=(0, 1))(params, init["u"], None)
    _close(g, g_ref)


def test_vmap_over_a_batch(x64):
    params, init, xs = _problem(18)
    batch = jnp.stack([init["u"] * s for s in (1.0, -0.5, 2.0)])
    scales = jnp.asarray([0.5, 1.0, 1.5])

    def loss(scale, u0, scan):
        def f(c, x):
            return jnp.tanh(scale * params["W"] @ c + x[0]), jnp.sum(c)

        c, ys = scan(f, u0, xs)
        return jnp.sum(c**2) + jnp.sum(ys)

    per_example = jax.jit(
        jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, 0, None)), static_argnums=2
    )
    ref = per_example(scales, batch, lax.scan)
    _close(per_example(scales, batch, _ours(snapshots=3)), ref)

    # and the gradient of a vmapped (batched) scan: the same numbers
    def total(s, b, scan):
        return jnp.sum(jax.vmap(loss, in_axes=(0, 0, None))(s, b, scan))

    _close(
        jax.jit(jax.grad(total, argnums=(0, 1)), static_argnums=2)(
            scales, batch, _ours(schedule=Online(18, snapshots=2))
        ),
        ref,
    )


def test_finite_difference_taylor_check(x64):
    """A referee independent of JAX's own reverse mode."""
    params, init, xs = _problem(30, seed=3)
    loss = jax.jit(_make_loss(_ours(snapshots=4)))
    g = jax.jit(jax.grad(_make_loss(_ours(snapshots=4))))(params, init, xs)
    rng = np.random.RandomState(7)
    direction = jax.tree.map(lambda x: jnp.asarray(rng.randn(*x.shape)), params)
    slope = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(direction)))
    errors = []
    for h in (1e-3, 5e-4, 2.5e-4):
        plus = jax.tree.map(lambda p, d: p + h * d, params, direction)
        minus = jax.tree.map(lambda p, d: p - h * d, params, direction)
        fd = (loss(plus, init, xs) - loss(minus, init, xs)) / (2 * h)
        errors.append(abs(float(fd - slope)))
    # Central differences: the error falls like h^2.
    assert errors[1] < errors[0] / 3 and errors[2] < errors[1] / 3, errors
    assert errors[-1] < 1e-5 * max(1.0, abs(float(slope)))


def test_step_traced_once_whatever_n_and_slots():
    counts = []
    for n, snapshots in [(1, 1), (10, 2), (1000, 10), (5000, 100)]:
        calls = []
        xs = jnp.ones((n, 3))

        def loss(w, u0):
            def f(c, x):
                calls.append(1)
                return jnp.tanh(w * c + x), jnp.sum(c)

            c, ys = checkpointed_scan(f, u0, xs, snapshots=snapshots)
            return jnp.sum(c) + jnp.sum(ys)

        jax.jit(jax.grad(loss, argnums=(0, 1))).lower(jnp.ones(3), jnp.ones(3))
        counts.append(len(calls))
    # closure_convert traces f to a jaxpr once; the forward sweep, the plain
    # scan and every VJP evaluate that jaxpr.
    assert counts == [1, 1, 1, 1]


def _hlo_ops(n, snapshots):
    xs = jnp.ones((n, 16), jnp.float32)

    def loss(w, u0):
        c, ys = checkpointed_scan(
            lambda c, x: (jnp.tanh(w * c + x), c[0]), u0, xs, snapshots=snapshots
        )
        return jnp.sum(c) + jnp.sum(ys)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(jnp.ones(16), jnp.ones(16)).compile()
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def test_compiled_program_size_does_not_grow_with_n_or_slots():
    # The program's size is what keeps compile time flat; the time itself is
    # the benchmark's to measure (bench_jax.py), not a test's.
    assert _hlo_ops(100, 10) == _hlo_ops(10_000, 10) == _hlo_ops(10_000, 100)


TRACE_SCHEDULES = [
    Revolve(1, 1),
    Revolve(2, 1),
    Revolve(10, 3),
    Revolve(57, 5),
    Revolve(40, 40),
    StoreAll(9),
    Periodic(23, 4),
    Periodic(5, 7),
    Online(31, snapshots=3),
    Online(6, snapshots=1),
    Multistage(35, [Level(4)]),
    Multistage(20, [Level(2, 0.5, 0.5)], forward_cost=1.0),
]


@pytest.mark.parametrize("schedule", TRACE_SCHEDULES, ids=repr)
def test_jax_interpreter_trace_equals_table_semantics(schedule):
    """The JAX half of DESIGN.md's cross-interpreter test (see jax_trace).

    The Python executor's half plugs in here: build the same :class:`Trace`
    from ``execute.run_adjoint`` with a step-counter solver and compare.
    """
    expected = table_trace(schedule)
    got = jax_trace(schedule)
    got.assert_equal(expected)
    stats = simulate(schedule)
    assert got.forward_count == stats.forward_count
    assert list(got.reverse_steps) == list(range(schedule.n_steps - 1, -1, -1))
    assert list(got.reverse_states) == list(got.reverse_steps)
    assert got.reads == stats.reads[:1] and got.writes == stats.writes[:1]


def test_program_buffer_has_exactly_the_schedule_slots():
    for schedule in (Revolve(100, 7), Online(80, snapshots=5), Periodic(50, 10), StoreAll(12)):
        program = compile_program(schedule)
        assert program.slots == simulate(schedule).peak_slots[0]
        assert program.forward_count == simulate(schedule).forward_count


def test_recompute_count_observed_from_inside_the_step(x64):
    """Count f's evaluations at run time with a host callback in the step."""
    n, snapshots = 40, 4
    calls = []

    def loss(w):
        def f(c, x):
            jax.debug.callback(lambda: calls.append(1))
            return jnp.sin(w * c + x), None

        c, _ = checkpointed_scan(f, jnp.ones(2), jnp.ones((n, 2)), snapshots=snapshots)
        return jnp.sum(c)

    jax.block_until_ready(jax.grad(loss)(jnp.asarray(0.7)))
    # the sweep + recomputations (the schedule's forward count), one step for
    # u_n (the sweep stops at u_{n-1}), and one forward inside each adjoint step
    expected = simulate(Revolve(n, snapshots)).forward_count + 1 + n
    assert len(calls) == expected


def test_checkpointed_decorator_and_fori_loop(x64):
    @checkpointed(snapshots=3)
    def step(c, x):
        return c * jnp.cos(x) + 0.1, c

    xs = jnp.linspace(0.0, 1.0, 25)
    c, ys = step(jnp.asarray(1.0), xs[0])
    assert np.isclose(c, np.cos(0.0) + 0.1)

    def both(scan):
        return jax.jit(jax.grad(lambda c0: (lambda r: r[0] + jnp.sum(r[1]))(scan(c0))))

    got = both(lambda c0: step.scan(c0, xs))(jnp.asarray(0.3))
    _close(got, both(lambda c0: lax.scan(step.f, c0, xs))(jnp.asarray(0.3)))

    def body(i, v):
        return jnp.sin(v * 1.01 + i * 0.01)

    ref = jax.jit(jax.grad(lambda v: jnp.sum(lax.fori_loop(3, 40, body, v))))(jnp.ones(3))
    got = jax.jit(jax.grad(lambda v: jnp.sum(checkpointed_fori_loop(3, 40, body, v, snapshots=4))))(
        jnp.ones(3)
    )
    _close(got, ref)
    assert checkpointed_fori_loop(5, 5, body, 1.0) == 1.0


def test_unroll_gives_the_same_gradients(x64):
    params, init, xs = _problem(29)
    ref = jax.jit(jax.grad(_make_loss(_plain)))(params, init, xs)
    for unroll in (3,):
        _close(
            jax.jit(jax.grad(_make_loss(_ours(snapshots=4, unroll=unroll))))(params, init, xs), ref
        )


# -- errors -----------------------------------------------------------------


def test_error_carry_changes_type():
    with pytest.raises(TypeError, match=r"changes carry\['u'\] from float32\[3\] to float32\[4\]"):
        checkpointed_scan(lambda c, x: ({"u": jnp.ones(4)}, None), {"u": jnp.ones(3)}, length=3)
    with pytest.raises(TypeError, match="keep its shapes and dtypes"):
        checkpointed_scan(lambda c, x: (c.astype(jnp.int32), None), jnp.ones(3), length=3)
    with pytest.raises(TypeError, match="structure of `init`"):
        checkpointed_scan(lambda c, x: ((c, c), None), jnp.ones(3), length=3)
    with pytest.raises(TypeError, match="pair"):
        checkpointed_scan(lambda c, x: c, jnp.ones(3), length=3)


def test_error_length_inconsistent_with_xs():
    with pytest.raises(ValueError, match="pass length=5"):
        checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(5), length=4)
    with pytest.raises(ValueError, match="give `length`"):
        checkpointed_scan(lambda c, x: (c, x), 0.0)
    with pytest.raises(ValueError, match="different leading axis"):
        checkpointed_scan(lambda c, x: (c, None), 0.0, (jnp.ones(5), jnp.ones(4)))


def test_error_schedule_for_another_length_or_not_static():
    with pytest.raises(ValueError, match=r"for 10 steps but the scan has length 5.*Revolve\(5"):
        checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(5), schedule=Revolve(10, 2))
    with pytest.raises(TypeError, match="must be a vlcc_adjoint.schedules.Schedule"):
        checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(5), schedule=[1, 2])
    with pytest.raises(ValueError, match="Online"):
        checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(5), schedule=Online(snapshots=3))
    with pytest.raises(ValueError, match="not both"):
        checkpointed_scan(
            lambda c, x: (c, x), 0.0, jnp.ones(5), schedule=Revolve(5, 2), snapshots=2
        )

    @jax.jit
    def traced(k):
        return checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(5), snapshots=k)

    with pytest.raises(TypeError, match="static_argnames"):
        traced(3)


# -- host levels through a TieredStore ----------------------------------------


def _store(schedule):
    """The store of `schedule`'s levels: the device slots and a memory tier
    per host level, with the schedule's plan."""
    from vlcc_adjoint.schedules import io_plan
    from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore

    host = [MemoryTier() for _ in schedule.levels[1:]]
    return TieredStore([DeviceTier(), *host], plan=io_plan(schedule))


def test_host_level_gradients_equal_plain_scan_repeated_runs(x64):
    """Multistage with a host level: level 1 lives in a TieredStore."""
    n = 23
    schedule = Multistage(n, [Level(2, 0.0, 0.0), Level(4, 1.0, 1.0)])
    assert simulate(schedule).writes[1] > 0  # the plan does use the host level
    store = _store(schedule)
    ref_val, ref = _reference(n)
    grad = jax.jit(
        jax.value_and_grad(
            _make_loss(_ours(schedule=schedule, store=store)), argnums=(0, 1, 2), allow_int=True
        )
    )
    for _ in range(2):  # the same compiled gradient, run twice
        val, got = grad(*_problem(n))
        _close(val, ref_val)
        _close(got, ref)
    stats = store.stats()
    assert stats.tiers[1].puts == 2 * simulate(schedule).writes[1]
    assert stats.tiers[0].puts == 2 * simulate(schedule).writes[0]  # level 0 seen by the store
    assert store.steps(0) == store.steps(1) == []  # every record deleted by the schedule


def test_host_tiers_without_a_plan_still_work_and_warn(x64):
    """The earlier form of the store: host tiers only, no plan, tier k - 1
    holding level k.  It warns, naming the new form, and gives the same
    gradients (with no restore read ahead: the store has no plan)."""
    from vlcc_adjoint.jax import host_io_stats
    from vlcc_adjoint.storage import MemoryTier, TieredStore

    n = 23
    schedule = Multistage(n, [Level(2, 0.0, 0.0), Level(4, 1.0, 1.0)])
    store = TieredStore([MemoryTier()])
    ref_val, ref = _reference(n)
    grad = jax.jit(
        jax.value_and_grad(
            _make_loss(_ours(schedule=schedule, store=store)), argnums=(0, 1, 2), allow_int=True
        )
    )
    with pytest.warns(DeprecationWarning, match=r"TieredStore\(\[DeviceTier\(\), MemoryTier"):
        val, got = grad(*_problem(n))
    _close(val, ref_val)
    _close(got, ref)
    assert store.stats().saves == simulate(schedule).writes[1]
    assert store.steps(0) == []
    io = host_io_stats(store)
    assert io.loads == simulate(schedule).reads[1] and io.prefetched == 0


def test_host_level_abandoned_forward_is_cleaned_up(x64):
    n = 12
    schedule = StoreAll(n, level=1)
    store = _store(schedule)

    def loss(w):
        c, _ = checkpointed_scan(
            lambda c, x: (jnp.sin(w * c + x), None),
            jnp.ones(2),
            jnp.ones((n, 2)),
            schedule=schedule,
            store=store,
        )
        return jnp.sum(c)

    jax.vjp(loss, jnp.asarray(0.3))  # forward only: host records stay behind
    assert len(store.steps(1)) == n - 1
    g = jax.grad(loss)(jnp.asarray(0.3))  # the next run deletes them first
    _close(
        g,
        jax.grad(
            lambda w: jnp.sum(
                lax.scan(lambda c, x: (jnp.sin(w * c + x), None), jnp.ones(2), jnp.ones((n, 2)))[0]
            )
        )(jnp.asarray(0.3)),
    )
    assert store.steps(1) == []


def _moves_between_levels():
    """A hand-written table with Moves device -> host -> disk and back."""
    from vlcc_adjoint.schedules import (
        Advance,
        Delete,
        Load,
        Move,
        Reverse,
        Save,
        Schedule,
        actions_to_table,
    )

    actions = [
        Save(0, 0),
        Advance(0, 1),
        Save(1, 0),
        Move(0, 0, 1),
        Move(0, 1, 2),
        Advance(1, 2),
        Save(2, 0),
        Move(2, 0, 1),
        Reverse(2),
        Move(2, 1, 0),
        Delete(2, 0),
        Load(1, 0),
        Reverse(1),
        Delete(1, 0),
        Move(0, 2, 1),
        Move(0, 1, 0),
        Load(0, 0),
        Delete(0, 0),
        Reverse(0),
    ]
    return Schedule(actions_to_table(actions), 3, levels=[Level(2), Level(1), Level(1)])


@pytest.mark.parametrize(
    "schedule",
    [
        Multistage(40, [Level(2, 0, 0), Level(3, 0.5, 0.5), Level(10, 3, 3)]),
        Periodic(20, 5, level=1, buffer_level=0),
        StoreAll(9, level=1),
        _moves_between_levels(),
    ],
    ids=repr,
)
def test_host_level_trace_equals_table_semantics(schedule):
    expected = table_trace(schedule)
    store = _store(schedule)
    jax_trace(schedule, store).assert_equal(expected)
    jax_trace(schedule, store).assert_equal(expected)  # a second run of the same store


def test_host_level_errors():
    from vlcc_adjoint.schedules import io_plan
    from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore

    f = lambda c, x: (c * x, None)  # noqa: E731
    with pytest.raises(ValueError, match="cannot run under jax.vmap"):
        jax.vmap(
            lambda c: checkpointed_scan(
                f,
                c,
                jnp.ones(12),
                schedule=StoreAll(12, level=1),
                store=_store(StoreAll(12, level=1)),
            )[0]
        )(jnp.ones(3))
    periodic = Periodic(9, 3, level=2)
    with pytest.raises(ValueError, match=r"store.tiers\[k\] holds level k"):
        short = TieredStore([DeviceTier(), MemoryTier()], plan=io_plan(Periodic(9, 3, level=1)))
        checkpointed_scan(f, 1.0, jnp.ones(9), schedule=periodic, store=short)
    with pytest.raises(TypeError, match="TieredStore"):
        checkpointed_scan(f, 1.0, jnp.ones(12), schedule=StoreAll(12, level=1), store={})
    planned = TieredStore([MemoryTier(), MemoryTier()], plan=io_plan(StoreAll(12, level=1)))
    with pytest.raises(ValueError, match="no DeviceTier for level 0"):
        checkpointed_scan(f, 1.0, jnp.ones(12), schedule=StoreAll(12, level=1), store=planned)
    unplanned = TieredStore([DeviceTier(), MemoryTier()])
    with pytest.raises(ValueError, match=r"plan=io_plan\(schedule\)"):
        checkpointed_scan(f, 1.0, jnp.ones(12), schedule=StoreAll(12, level=1), store=unplanned)
    other = _store(StoreAll(12, level=1))
    with pytest.raises(ValueError, match="the store's plan is for"):
        checkpointed_scan(
            f, 1.0, jnp.ones(12), schedule=Periodic(12, 4, level=1, buffer_level=0), store=other
        )
    # The earlier form, host tiers only (tier k - 1 holds level k): too few tiers.
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="tiers"):
        checkpointed_scan(f, 1.0, jnp.ones(9), schedule=periodic, store=TieredStore([MemoryTier()]))


def test_error_multilevel_schedule_needs_a_store():
    schedule = Multistage(12, [Level(2), Level(3, 1.0, 1.0)])
    if max(simulate(schedule).peak_slots[1:]) == 0:
        pytest.skip("the planner kept this one on level 0")
    with pytest.raises(ValueError, match="store=TieredStore"):
        checkpointed_scan(lambda c, x: (c * x, None), 1.0, jnp.ones(12), schedule=schedule)
    with pytest.raises(ValueError, match="level 1"):
        checkpointed_scan(
            lambda c, x: (c * x, None), 1.0, jnp.ones(12), schedule=StoreAll(12, level=1)
        )


def test_error_invalid_table_is_reported_by_simulate():
    from vlcc_adjoint.schedules import Advance, Reverse, Schedule, actions_to_table

    bad = Schedule(actions_to_table([Advance(0, 2), Reverse(1), Reverse(0)]), 2)
    with pytest.raises(InvalidScheduleError, match="Reverse"):
        checkpointed_scan(lambda c, x: (c * x, None), 1.0, jnp.ones(2), schedule=bad)
