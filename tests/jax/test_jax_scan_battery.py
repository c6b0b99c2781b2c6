"""``checkpointed_scan`` as a drop-in for ``jax.lax.scan``: the scenarios of
``lax.scan``'s own documentation and tests, in float64.

Each case builds a loss from a scan function, once with ``lax.scan`` (the
referee) and once with ``checkpointed_scan``, and compares the values and
the gradients with respect to every argument (the initial carry, ``xs`` and
closed-over parameters) to 1e-12.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from vlcc_adjoint.jax import checkpointed_scan  # noqa: E402
from vlcc_adjoint.schedules import Level, Multistage, Revolve, StoreAll  # noqa: E402

pytestmark = pytest.mark.usefixtures("x64")  # every scenario in float64 (tests/conftest.py)


def _close(a, b, rtol=1e-12, atol=1e-12):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb, strict=True):
        assert np.shape(x) == np.shape(y) and np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _ours(**options):
    return functools.partial(checkpointed_scan, **options)


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "W": jnp.asarray(rng.standard_normal((3, 3)) * 0.5),
        "b": jnp.asarray(rng.standard_normal(3) * 0.1),
    }
    init = {"u": jnp.asarray(rng.standard_normal(3)), "v": (jnp.asarray(rng.standard_normal(2)),)}
    xs = {"a": jnp.asarray(rng.standard_normal((n, 3))), "s": jnp.asarray(rng.standard_normal(n))}
    return params, init, xs


def _step(params):
    """A step with a pytree carry, pytree xs and pytree ys, closing over params."""

    def f(c, x):
        u = jnp.tanh(params["W"] @ c["u"] + x["a"] + params["b"] * x["s"])
        v = (c["v"][0] * jnp.cos(x["s"]) + jnp.sum(u) * 0.1,)
        return {"u": u, "v": v}, {"norm": jnp.sum(u**2), "pair": (u[0], v[0])}

    return f


def _loss(scan, **kw):
    def loss(params, init, xs):
        c, ys = scan(_step(params), init, xs, **kw)
        return (
            jnp.sum(c["u"] ** 3)
            + jnp.sum(jnp.sin(c["v"][0]))
            + jnp.sum(ys["norm"])
            + jnp.sum(jnp.cos(ys["pair"][0]))
            + jnp.sum(ys["pair"][1] ** 2)
        )

    return loss


def _same_value_and_gradients(make_loss, args, argnums=(0, 1, 2), jit=True, **options):
    ref = jax.value_and_grad(make_loss(lax.scan), argnums=argnums)
    got = jax.value_and_grad(make_loss(_ours(**options)), argnums=argnums)
    if jit:
        ref, got = jax.jit(ref), jax.jit(got)
    _close(got(*args), ref(*args))


SCHEDULES = {
    "revolve": lambda n: Revolve(n, 2),
    "multistage": lambda n: Multistage(n, [Level(3)]),
    "storeall": lambda n: StoreAll(n),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_pytrees_and_closed_over_params_under_every_schedule(name):
    n = 9
    _same_value_and_gradients(_loss, _data(n), schedule=SCHEDULES[name](n))


@pytest.mark.parametrize("n", [0, 1])
def test_length_zero_and_one(n):
    args = _data(n)
    c, ys = checkpointed_scan(_step(args[0]), args[1], args[2])
    c_ref, ys_ref = lax.scan(_step(args[0]), args[1], args[2])
    _close((c, ys), (c_ref, ys_ref))
    if n == 0:
        _close(c, args[1])  # init itself, and empty ys
        assert all(y.shape[0] == 0 for y in jax.tree.leaves(ys))
    _same_value_and_gradients(_loss, args, jit=False)


def test_length_zero_with_xs_none_and_a_schedule_for_another_length_is_refused():
    f = lambda c, _: (c + 1.0, c)  # noqa: E731
    c, ys = checkpointed_scan(f, jnp.ones(2), None, length=0)
    _close((c, ys), lax.scan(f, jnp.ones(2), None, length=0))
    with pytest.raises(ValueError, match="steps"):
        checkpointed_scan(f, jnp.ones(2), None, length=0, schedule=Revolve(4, 2))


def test_xs_none_with_length_and_ys_none():
    def make(scan):
        def loss(p, u0):
            c, ys = scan(lambda c, _: (jnp.sin(p * c) + 0.1, None), u0, None, length=7)
            assert ys is None
            return jnp.sum(c**2)

        return loss

    _same_value_and_gradients(
        make, (jnp.asarray(0.8), jnp.arange(3.0)), argnums=(0, 1), snapshots=2
    )


@pytest.mark.parametrize("unroll", [1, 3, True])
def test_reverse_scans_from_the_end_as_lax_scan(unroll):
    args = _data(8)
    c, ys = checkpointed_scan(_step(args[0]), args[1], args[2], reverse=True, unroll=unroll)
    _close((c, ys), lax.scan(_step(args[0]), args[1], args[2], reverse=True))
    _same_value_and_gradients(
        lambda scan: _loss(scan, reverse=True, unroll=unroll), args, snapshots=3
    )


@pytest.mark.parametrize("unroll", [2, True])
def test_unroll(unroll):
    _same_value_and_gradients(lambda scan: _loss(scan, unroll=unroll), _data(7), snapshots=2)


def test_without_jit_and_gradient_wrt_each_argument_alone():
    args = _data(6)
    for argnums in (0, 1, 2):
        _same_value_and_gradients(_loss, args, argnums=argnums, jit=False, snapshots=2)


def test_vmap_of_the_gradient_and_gradient_of_vmap():
    params, init, xs = _data(6)
    inits = jax.tree.map(lambda x: jnp.stack([x, 2 * x, -x]), init)

    def per_example(scan):
        return jax.vmap(jax.grad(_loss(scan), argnums=(0, 1)), in_axes=(None, 0, None))

    _close(
        jax.jit(per_example(_ours(snapshots=2)))(params, inits, xs),
        jax.jit(per_example(lax.scan))(params, inits, xs),
    )

    def batched(scan):
        return lambda p, i, x: jnp.sum(jax.vmap(_loss(scan), in_axes=(None, 0, None))(p, i, x))

    _same_value_and_gradients(batched, (params, inits, xs), snapshots=2)


def _scalar_problem():
    def make(scan, **kw):
        def loss(p, u0, xs):
            def f(c, x):
                c2 = jnp.sin(p * c) + x * c[::-1]
                return c2, jnp.sum(c2**2)

            c, ys = scan(f, u0, xs, **kw)
            return jnp.sum(c**3) + jnp.sum(ys)

        return loss

    return make, (
        jnp.asarray(0.7),
        jnp.asarray([0.3, -0.2, 0.5]),
        jnp.linspace(-1.0, 1.0, 30).reshape(10, 3),
    )


@pytest.mark.parametrize("name", ["revolve", "storeall"])
def test_second_order_grad_of_grad_and_hessian_equal_lax_scan(name):
    make, args = _scalar_problem()
    ours = make(_ours(schedule=SCHEDULES[name](10)))
    ref = make(lax.scan)
    _close(jax.jit(jax.grad(jax.grad(ours)))(*args), jax.jit(jax.grad(jax.grad(ref)))(*args))
    _close(
        jax.jit(jax.hessian(ours, argnums=(0, 1, 2)))(*args),
        jax.jit(jax.hessian(ref, argnums=(0, 1, 2)))(*args),
        rtol=1e-10,
    )

    # reverse over reverse with respect to the initial carry
    def g(loss):
        return jax.grad(lambda u: jnp.sum(jax.grad(loss, argnums=1)(args[0], u, args[2]) ** 2))

    _close(g(ours)(args[1]), g(ref)(args[1]), rtol=1e-10)


def test_forward_mode_jvp_and_jacfwd_equal_lax_scan():
    make, args = _scalar_problem()
    ours, ref = make(_ours(snapshots=2)), make(lax.scan)
    tangents = (jnp.asarray(1.0), jnp.ones(3), jnp.ones((10, 3)))
    _close(jax.jvp(ours, args, tangents), jax.jvp(ref, args, tangents))
    _close(jax.jacfwd(ours, argnums=1)(*args), jax.jacfwd(ref, argnums=1)(*args))


def test_differentiating_the_pullback_in_its_cotangent_says_what_to_use():
    make, args = _scalar_problem()
    f = lambda c, x: (jnp.sin(c) + x, c)  # noqa: E731
    _, pullback = jax.vjp(lambda u: checkpointed_scan(f, u, args[2], snapshots=2)[0], args[1])
    with pytest.raises(NotImplementedError, match="jax.hessian"):
        jax.grad(lambda ct: jnp.sum(pullback(ct)[0]))(jnp.ones(3))
    # the same with lax.scan works: the check is not spurious for lax.scan's pullback
    _, ref_pullback = jax.vjp(lambda u: lax.scan(f, u, args[2])[0], args[1])
    assert jnp.all(jnp.isfinite(jax.grad(lambda ct: jnp.sum(ref_pullback(ct)[0]))(jnp.ones(3))))


def test_forward_mode_around_vmap():
    make, args = _scalar_problem()
    inits = jnp.stack([args[1], 2 * args[1]])

    def batched(scan):
        return lambda u: jnp.sum(jax.vmap(make(scan), in_axes=(None, 0, None))(args[0], u, args[2]))

    tangent = jnp.ones_like(inits)
    _close(
        jax.jvp(batched(_ours(snapshots=2)), (inits,), (tangent,)),
        jax.jvp(batched(lax.scan), (inits,), (tangent,)),
    )
