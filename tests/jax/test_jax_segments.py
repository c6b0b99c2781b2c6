"""checkpointed_scan(segment=...): a schedule over segments, each reversed with its residuals."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from tests.jax import oscillator  # noqa: E402
from vlcc_adjoint.jax import (  # noqa: E402
    checkpointed,
    checkpointed_fori_loop,
    checkpointed_scan,
)
from vlcc_adjoint.jax._segments import (  # noqa: E402
    choose_segment,
    residual_bytes,
    segmented_forward_count,
)
from vlcc_adjoint.schedules import Revolve, binomial_forward_count  # noqa: E402


def _args(n, size=8):
    w = jnp.linspace(0.5, 1.5, size)
    u0 = jnp.linspace(-1.0, 1.0, size)
    xs = jnp.cos(jnp.arange(n * size, dtype=w.dtype)).reshape(n, size)
    return w, u0, xs


def _check(n, **options):
    args = _args(n)
    reverse = options.get("reverse", False)
    ref_val, ref = jax.value_and_grad(
        oscillator.loss(lambda f, c, xs: lax.scan(f, c, xs, reverse=reverse)), argnums=(0, 1, 2)
    )(*args)
    ours = oscillator.loss(lambda f, c, xs: checkpointed_scan(f, c, xs, **options))
    val, got = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(*args)
    np.testing.assert_allclose(val, ref_val, rtol=1e-12)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "n, options",
    [
        (47, dict(segment=5, snapshots=3)),  # 9 segments and a 2-step tail
        (48, dict(segment=6, snapshots=2)),  # no tail
        (47, dict(segment=47)),  # one segment: plain remat
        (30, dict(segment=4, schedule=Revolve(7, 2))),
        (47, dict(segment="auto", snapshots=4)),
        (20, dict(segment=3, snapshots=2, reverse=True)),
    ],
)
def test_segmented_gradients_equal_plain_scan(x64, n, options):
    _check(n, **options)


def test_segmented_scan_with_xs_none_and_the_conveniences(x64):
    def body(i, v):
        return v * 0.9 + jnp.sin(v) * 0.1 + i * 1e-3

    def loss(v0):
        return jnp.sum(checkpointed_fori_loop(0, 23, body, v0, snapshots=2, segment=4))

    def ref(v0):
        return jnp.sum(lax.fori_loop(0, 23, body, v0))

    v0 = jnp.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(jax.grad(loss)(v0), jax.grad(ref)(v0), rtol=1e-12)
    step = checkpointed(lambda c, x: (c * x, None), snapshots=2, segment=3)
    xs = jnp.linspace(1.0, 1.1, 10)
    np.testing.assert_allclose(
        jax.grad(lambda c: step.scan(c, xs)[0])(2.0),
        jax.grad(lambda c: lax.scan(lambda c, x: (c * x, None), c, xs)[0])(2.0),
    )


def test_segment_recomputation_count_observed_from_inside_the_step():
    """With segments the step runs ``B t(m, c) + tail`` times outside the
    VJPs, fewer than Revolve over the steps with the same slots."""
    n, segment, slots = 60, 6, 3
    calls = []

    def loss(w):
        def f(c, x):
            # The carry as an operand: a callback without one is loop
            # invariant, and differentiated scans hoist it out of the loop.
            jax.debug.callback(lambda _: calls.append(1), c)
            return jnp.sin(w * c + x), None

        c, _ = checkpointed_scan(f, jnp.ones(2), jnp.ones((n, 2)), segment=segment, snapshots=slots)
        return jnp.sum(c)

    jax.block_until_ready(jax.grad(loss)(jnp.asarray(0.7)))
    m = n // segment
    # The sweep's advances, the forward rule's last segment, and each
    # segment's VJP runs its steps forward once more.
    expected = segment * binomial_forward_count(m, slots) + segment + n
    assert len(calls) == expected
    assert segmented_forward_count(n, segment, slots) < binomial_forward_count(n, slots)


def test_auto_segment_stays_within_the_budget_and_prefers_fewer_recomputations():
    state, resid = 2**19, 2**18
    for n, slots in [(10_000, 100), (10_000, 10), (1000, 30), (50, 2)]:
        b, c = choose_segment(n, slots, state, resid)
        assert c * state + b * resid <= slots * state + resid
        assert segmented_forward_count(n, b, c) <= binomial_forward_count(n, slots)
    # Residuals as large as the budget: no room for segments.
    assert choose_segment(1000, 3, 100, 10_000) == (1, 3)


def test_residual_bytes_of_a_step_are_measured():
    size = 64

    def step(c, x, k):
        (u,) = c
        return [u * jnp.sin(k[0] * u)], []  # sin(k u) and cos(k u) kept per step

    r = residual_bytes(step, [jnp.zeros(size)], [], [jnp.ones(size)])
    assert size * 4 <= r <= 4 * size * 4


def test_segment_errors():
    xs = jnp.ones(10)
    f = lambda c, x: (c + x, None)  # noqa: E731
    with pytest.raises(ValueError, match="segment <= 10"):
        checkpointed_scan(f, 0.0, xs, segment=11)
    with pytest.raises(ValueError, match=">= 1"):
        checkpointed_scan(f, 0.0, xs, segment=0)
    with pytest.raises(ValueError, match="'auto'"):
        checkpointed_scan(f, 0.0, xs, segment="fast")
    with pytest.raises(TypeError, match="Python int"):
        checkpointed_scan(f, 0.0, xs, segment=2.5)
    with pytest.raises(ValueError, match=r"Revolve\(5"):
        checkpointed_scan(f, 0.0, xs, segment=2, schedule=Revolve(10, 2))
    with pytest.raises(ValueError, match="segment=B, an int"):
        checkpointed_scan(f, 0.0, xs, segment="auto", schedule=Revolve(10, 2))
