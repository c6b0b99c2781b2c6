"""Train a small neural ODE through a long RK4 integration with ``checkpointed_scan``.

The data are trajectories of a damped nonlinear oscillator (a pendulum with
friction), sampled along a long time window.  The model is ``dz/dt =
MLP(z)``, a two-layer tanh network, integrated with classic fourth-order
Runge-Kutta for ``--steps`` small steps; the loss compares the integrated
trajectory with the data at every ``--every``-th step.  Gradients with
respect to the network's weights flow through the whole integration by
:func:`vlcc_adjoint.jax.checkpointed_scan`, which keeps ``--snapshots``
states instead of all ``--steps`` (the memory of a plain ``lax.scan`` grows
with the integration length; this does not).  Plain JAX: no flax, no optax;
the optimiser is a hand-written Adam.

    python examples/jax_neural_ode.py                  # 1,000 RK4 steps, 100 iterations
    python examples/jax_neural_ode.py --steps 20000 --snapshots 10
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from vlcc_adjoint.cli import Integer, Number, Parser
from vlcc_adjoint.jax import checkpointed_scan


def pendulum(z):
    """The true dynamics: a pendulum with friction, ``z = (angle, velocity)``."""
    theta, omega = z[..., 0], z[..., 1]
    return jnp.stack([omega, -jnp.sin(theta) - 0.15 * omega], axis=-1)


def rk4(field, z, dt):
    k1 = field(z)
    k2 = field(z + 0.5 * dt * k1)
    k3 = field(z + 0.5 * dt * k2)
    k4 = field(z + dt * k3)
    return z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def init_mlp(key, sizes=(2, 32, 32, 2)):
    params = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        scale = 0.1 if i == len(sizes) - 2 else 1 / np.sqrt(m)
        params.append({"W": scale * jax.random.normal(sub, (m, n)), "b": jnp.zeros(n)})
    return params


def mlp(params, z):
    for layer in params[:-1]:
        z = jnp.tanh(z @ layer["W"] + layer["b"])
    return z @ params[-1]["W"] + params[-1]["b"]


def integrate(params, z0, steps, dt, every, snapshots):
    """RK4 for `steps` steps from the batch `z0`; the states every `every` steps."""

    def step(z, i):
        z = rk4(lambda y: mlp(params, y), z, dt)  # params are closed over: they get gradients
        return z, z

    _, zs = checkpointed_scan(step, z0, jnp.arange(steps), snapshots=snapshots)
    return zs[every - 1 :: every]


def adam(lr=5e-3, b1=0.9, b2=0.999, eps=1e-8):
    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return zeros, zeros, 0

    def update(grads, state, params):
        m, v, t = state
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (m, v, t)

    return init, update


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=Integer(1), default=1000, help="RK4 steps per trajectory")
    parser.add_argument("--dt", type=Number(above=0.0), default=0.01, help="RK4 time step")
    parser.add_argument(
        "--every", type=Integer(1), default=10, help="observe every this many steps"
    )
    parser.add_argument("--snapshots", type=Integer(1), default=20, help="checkpoint slots")
    parser.add_argument("--iterations", type=Integer(1), default=100, help="Adam iterations")
    parser.add_argument("--batch", type=Integer(1), default=8, help="trajectories per iteration")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.every > args.steps:
        parser.error(f"--every {args.every} is more than --steps {args.steps}: nothing observed")

    key = jax.random.PRNGKey(0)
    key, k_data, k_model = jax.random.split(key, 3)
    z0 = jax.random.uniform(k_data, (args.batch, 2), minval=-2.0, maxval=2.0)
    # The data: the true system, integrated with the same RK4.
    true_traj = jax.lax.scan(
        lambda z, _: (rk4(pendulum, z, args.dt),) * 2, z0, None, length=args.steps
    )[1][args.every - 1 :: args.every]

    params = init_mlp(k_model)

    def loss(params):
        pred = integrate(params, z0, args.steps, args.dt, args.every, args.snapshots)
        return jnp.mean((pred - true_traj) ** 2)

    opt_init, opt_update = adam()
    opt_state = opt_init(params)

    @jax.jit
    def train_step(params, opt_state):
        value, grads = jax.value_and_grad(loss)(params)
        params, opt_state = opt_update(grads, opt_state, params)
        return params, opt_state, value

    print(
        f"neural ODE: {args.steps} RK4 steps (t = 0..{args.steps * args.dt:g}), batch "
        f"{args.batch}, {args.snapshots} checkpoint slots, {args.iterations} Adam iterations"
    )
    t0 = time.perf_counter()
    train_step = train_step.lower(params, opt_state).compile()
    print(f"  compile {time.perf_counter() - t0:.1f} s")
    params, opt_state, first = train_step(params, opt_state)
    print(f"  first loss {float(first):.4f}")
    t0 = time.perf_counter()
    for it in range(2, args.iterations + 1):
        params, opt_state, value = train_step(params, opt_state)
        if it % max(1, args.iterations // 5) == 0:
            print(f"  iteration {it:4d}: loss {float(value):.5f}")
    elapsed = time.perf_counter() - t0
    print(f"  {elapsed / max(1, args.iterations - 1) * 1e3:.1f} ms per iteration")
    final = float(loss(params))
    print(f"final loss {final:.5f} (from {float(first):.4f})")
    return first, final


if __name__ == "__main__":
    main()
