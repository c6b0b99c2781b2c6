"""JAX neural ODE with checkpointed_scan

A tiny neural ODE: an MLP vector field (2-16-2) integrated by 500 RK4 steps.
`checkpointed_scan` has `jax.lax.scan`'s signature; its reverse pass follows
a Revolve schedule with 8 snapshots instead of storing all 500 carries. The
gradient is compared with plain `jax.lax.scan` differentiated by JAX.

Then the same gradient with the checkpoints on three levels: 4 slots in
device memory, 8 in host memory and the rest on disk.  One `TieredStore`
holds every level of the schedule, with its plan: tier 0 is a `DeviceTier`
(the device buffer's slots stay on the device; the store follows their
actions), tiers 1 and 2 are host memory and a zarr directory, and the store
reads every restore from the disk ahead of the backward pass that needs it.
"""

import tempfile

import jax
import jax.numpy as jnp

from vlcc_adjoint.jax import checkpointed_scan, host_io_stats
from vlcc_adjoint.schedules import Level, Multistage, io_plan
from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore, ZarrTier

jax.config.update("jax_enable_x64", True)


def mlp(params, z):
    (w1, b1), (w2, b2) = params
    return jnp.tanh(z @ w1 + b1) @ w2 + b2


def rk4(params, z, dt=0.01):
    k1 = mlp(params, z)
    k2 = mlp(params, z + 0.5 * dt * k1)
    k3 = mlp(params, z + 0.5 * dt * k2)
    k4 = mlp(params, z + dt * k3)
    return z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def loss(params, z0, scan):
    def step(z, _):
        z = rk4(params, z)
        return z, z[0]

    z_n, xs = scan(step, z0, None, length=500)
    return jnp.sum(z_n**2) + 1e-3 * jnp.sum(xs**2)


k1, k2 = jax.random.split(jax.random.PRNGKey(0))
params = [
    (0.5 * jax.random.normal(k1, (2, 16)), jnp.zeros(16)),
    (0.5 * jax.random.normal(k2, (16, 2)), jnp.zeros(2)),
]
z0 = jnp.array([1.0, 0.0])

ours = jax.grad(loss)(
    params, z0, lambda f, c, xs, length: checkpointed_scan(f, c, xs, length=length, snapshots=8)
)
plain = jax.grad(loss)(params, z0, jax.lax.scan)
err = max(
    float(jnp.abs(a - b).max() / jnp.abs(b).max())
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(plain))
)
print("loss:", float(loss(params, z0, jax.lax.scan)))
print(f"max relative difference to jax.lax.scan's gradient: {err:.1e}")
assert err < 1e-10, err

# Beyond device memory: device -> host memory -> disk, one store, one plan.
schedule = Multistage(500, [Level(4, 0.0, 0.0), Level(8, 0.2, 0.2), Level(500, 2.0, 2.0)])
with tempfile.TemporaryDirectory() as path:
    tiers = [DeviceTier(), MemoryTier(), ZarrTier(f"{path}/states", mode="w")]
    with TieredStore(tiers, plan=io_plan(schedule)) as store:
        tiered = jax.grad(loss)(
            params,
            z0,
            lambda f, c, xs, length: checkpointed_scan(
                f, c, xs, length=length, schedule=schedule, store=store
            ),
        )
        io = host_io_stats(store)
err = max(
    float(jnp.abs(a - b).max() / jnp.abs(b).max())
    for a, b in zip(jax.tree_util.tree_leaves(tiered), jax.tree_util.tree_leaves(plain))
)
print(
    f"three levels: {io.saves} captures to the host, {io.loads} restores "
    f"({io.prefetched} read ahead), {io.stall_s * 1e3:.1f} ms waited; "
    f"max relative difference {err:.1e}"
)
assert err < 1e-10, err
