"""A damped nonlinear oscillator driven by ``xs``: the scan body of the JAX tests.

Imported by test modules after their ``pytest.importorskip("jax")``.
"""

import jax.numpy as jnp


def step(c, x, w):
    """One step of the carry ``(u, v)`` under the input `x` and the frequency `w`."""
    u, v = c
    u_new = u + 0.05 * v
    v_new = v - 0.05 * jnp.sin(w * u_new) + 0.01 * x
    return (u_new, v_new), jnp.sum(u_new**2)


def loss(scan):
    """``loss(w, u0, xs)`` of the run of `scan` (``lax.scan``'s signature) over
    :func:`step`; the outputs ``ys`` are weighted by their index, so that their
    order matters."""

    def loss(w, u0, xs):
        (u, v), ys = scan(lambda c, x: step(c, x, w), (u0, jnp.zeros_like(u0)), xs)
        return jnp.sum(u * v) + jnp.sum(ys * jnp.arange(ys.shape[0]))

    return loss
