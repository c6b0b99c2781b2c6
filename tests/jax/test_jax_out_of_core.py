"""checkpointed_scan with states on a disk level: device -> host memory -> zarr.

A small device and host budget forces the schedule to keep most of its
checkpoints on a ZarrTier; the gradient must equal plain ``lax.scan``'s, the
disk level must really be written and read, and the restores from it must
be read ahead by the plan (started at an earlier callback, collected later).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vlcc_adjoint.jax import checkpointed_scan, host_io_stats, jax_trace
from vlcc_adjoint.schedules import Level, Multistage, simulate, table_trace
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier


def _step(c, x, w):
    u, v = c
    u_new = u + 0.05 * v
    v_new = v - 0.05 * jnp.sin(w * u_new) + 0.01 * x
    return (u_new, v_new), jnp.sum(u_new**2)


def _loss(scan):
    def loss(w, u0, xs):
        (u, v), ys = scan(lambda c, x: _step(c, x, w), (u0, jnp.zeros_like(u0)), xs)
        return jnp.sum(u * v) + jnp.sum(ys)

    return loss


def _problem(n, size=16):
    key = jax.random.PRNGKey(0)
    w = jax.random.uniform(key, (size,), jnp.float64, 0.5, 1.5)
    u0 = jnp.linspace(-1.0, 1.0, size, dtype=jnp.float64)
    xs = jnp.cos(jnp.arange(n * size, dtype=jnp.float64)).reshape(n, size)
    return w, u0, xs


def _spilling_schedule(n):
    # Two device slots, two host slots, the rest on disk.
    return Multistage(n, [Level(2, 0.0, 0.0), Level(2, 0.2, 0.2), Level(n, 2.0, 2.0)])


def _stores(tmp_path):
    return TieredStore([MemoryTier(), ZarrTier(tmp_path / "states", mode="w")])


def test_states_spill_to_zarr_and_gradient_equals_lax_scan(x64, tmp_path):
    n = 60
    schedule = _spilling_schedule(n)
    stats = simulate(schedule)
    assert stats.writes[2] > 0 and stats.reads[2] > 0  # the plan uses the disk level
    args = _problem(n)
    ref = jax.value_and_grad(_loss(lambda f, c, xs: lax.scan(f, c, xs)), argnums=(0, 1, 2))(*args)
    with _stores(tmp_path) as store:
        host_io_stats(store, reset=True)
        grad = jax.jit(
            jax.value_and_grad(
                _loss(lambda f, c, xs: checkpointed_scan(f, c, xs, schedule=schedule, store=store)),
                argnums=(0, 1, 2),
            )
        )
        for _ in range(2):  # the same compiled gradient, twice on one store
            val, got = grad(*args)
            np.testing.assert_allclose(val, ref[0], rtol=1e-12)
            for a, b in zip(got, ref[1]):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        io = host_io_stats(store)
        assert store.steps(1) == []  # every disk record deleted by the schedule
        disk = store.stats()
    assert io.saves == 2 * (stats.writes[1] + stats.writes[2])
    restores = stats.reads[1] + stats.reads[2]
    assert io.loads == 2 * restores
    # Each restore's record is written long before it is needed: the plan
    # starts most reads at an earlier callback.
    assert io.prefetched >= io.loads // 2, io
    assert io.stall_s >= 0.0 and io.read_s > 0.0
    assert disk.saves >= 2 * stats.writes[2]


def test_read_ahead_hands_over_the_right_states(tmp_path):
    """The JAX interpreter, read-ahead on, against the table's semantics:
    every adjoint step sees the state the schedule says, and every level's
    reads and writes are counted as the schedule counts them."""
    n = 45
    schedule = _spilling_schedule(n)
    with _stores(tmp_path) as store:
        host_io_stats(store, reset=True)
        jax_trace(schedule, store).assert_equal(table_trace(schedule))
        io = host_io_stats(store)
    assert io.prefetched > 0


def test_without_a_plan_every_restore_stalls(tmp_path):
    """The baseline the read-ahead improves on: no plan, no read started ahead."""
    from vlcc_adjoint.jax._host import HostSession
    from vlcc_adjoint.jax._program import compile_program

    schedule = _spilling_schedule(30)
    program = compile_program(schedule, host=True)
    with _stores(tmp_path) as store:
        session = HostSession(program, store, [jax.ShapeDtypeStruct((), jnp.int32)])
        assert session.depth == 0
        planned = HostSession(
            program,
            store,
            [jax.ShapeDtypeStruct((), jnp.int32)],
            plan=__import__("vlcc_adjoint.schedules", fromlist=["io_plan"]).io_plan(schedule),
        )
        assert planned.depth > 0 and len(planned.ahead_hid) == sum(simulate(schedule).reads[1:])
        # A restore may start only after the action that wrote its record.
        assert np.all(planned.ahead_ready < planned.ahead_hid)
