"""checkpointed_scan with states on a disk level: device -> host memory -> zarr.

A small device and host budget forces the schedule to keep most of its
checkpoints on a ZarrTier; the gradient must equal plain ``lax.scan``'s, the
disk level must really be written and read, and the restores from it must
be read ahead by the store, which follows the whole schedule's plan (read
while the device computes, collected at the restore's callback).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from tests.jax import oscillator  # noqa: E402
from vlcc_adjoint.jax import checkpointed_scan, host_io_stats, jax_trace  # noqa: E402
from vlcc_adjoint.schedules import (  # noqa: E402
    Level,
    Multistage,
    io_plan,
    simulate,
    table_trace,
)
from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore, ZarrTier  # noqa: E402


def _problem(n, size=16):
    key = jax.random.PRNGKey(0)
    w = jax.random.uniform(key, (size,), jnp.float64, 0.5, 1.5)
    u0 = jnp.linspace(-1.0, 1.0, size, dtype=jnp.float64)
    xs = jnp.cos(jnp.arange(n * size, dtype=jnp.float64)).reshape(n, size)
    return w, u0, xs


def _spilling_schedule(n):
    # Two device slots, two host slots, the rest on disk.
    return Multistage(n, [Level(2, 0.0, 0.0), Level(2, 0.2, 0.2), Level(n, 2.0, 2.0)])


def _stores(tmp_path, schedule):
    """Every level of `schedule` in one store: the device slots, host
    memory and a ZarrTier, with the schedule's plan (restores read ahead)."""
    disk = ZarrTier(tmp_path / "states", mode="w")
    return TieredStore([DeviceTier(), MemoryTier(), disk], plan=io_plan(schedule))


def test_states_spill_to_zarr_and_gradient_equals_lax_scan(x64, tmp_path):
    n = 60
    schedule = _spilling_schedule(n)
    stats = simulate(schedule)
    assert stats.writes[2] > 0 and stats.reads[2] > 0  # the plan uses the disk level
    args = _problem(n)
    ref = jax.value_and_grad(
        oscillator.loss(lambda f, c, xs: lax.scan(f, c, xs)), argnums=(0, 1, 2)
    )(*args)
    with _stores(tmp_path, schedule) as store:
        host_io_stats(store, reset=True)
        grad = jax.jit(
            jax.value_and_grad(
                oscillator.loss(
                    lambda f, c, xs: checkpointed_scan(f, c, xs, schedule=schedule, store=store)
                ),
                argnums=(0, 1, 2),
            )
        )
        for _ in range(2):  # the same compiled gradient, twice on one store
            val, got = grad(*args)
            np.testing.assert_allclose(val, ref[0], rtol=1e-12)
            for a, b in zip(got, ref[1]):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        io = host_io_stats(store)
        assert store.steps(2) == []  # every disk record deleted by the schedule
        disk = store.stats()
    assert io.saves == 2 * (stats.writes[1] + stats.writes[2])
    restores = stats.reads[1] + stats.reads[2]
    assert io.loads == 2 * restores
    # Each restore's record is written long before it is needed: the store
    # reads most of them ahead, by the plan, while the device computes.
    assert io.prefetched >= io.loads // 2, io
    assert io.stall_s >= 0.0 and io.read_s > 0.0
    assert disk.tiers[2].puts == 2 * stats.writes[2]
    assert disk.tiers[0].puts == 2 * stats.writes[0]  # the device level, seen by the store


def test_read_ahead_hands_over_the_right_states(tmp_path):
    """The JAX interpreter, read-ahead on, against the table's semantics:
    every adjoint step sees the state the schedule says, and every level's
    reads and writes are counted as the schedule counts them."""
    n = 45
    schedule = _spilling_schedule(n)
    with _stores(tmp_path, schedule) as store:
        host_io_stats(store, reset=True)
        jax_trace(schedule, store).assert_equal(table_trace(schedule))
        io = host_io_stats(store)
    assert io.prefetched > 0


def test_without_a_plan_no_restore_is_read_ahead(x64, tmp_path):
    """The baseline the read-ahead improves on: the earlier form of the
    store (host tiers, no plan) reads every restore when it is needed."""
    n = 30
    schedule = _spilling_schedule(n)
    args = _problem(n)
    loss = oscillator.loss(
        lambda f, c, xs: checkpointed_scan(f, c, xs, schedule=schedule, store=store)
    )
    with TieredStore([MemoryTier(), ZarrTier(tmp_path / "states", mode="w")]) as store:
        host_io_stats(store, reset=True)
        with pytest.warns(DeprecationWarning, match="deprecated"):
            got = jax.grad(loss, argnums=(0, 1, 2))(*args)
        io = host_io_stats(store)
    ref = jax.grad(oscillator.loss(lambda f, c, xs: lax.scan(f, c, xs)), argnums=(0, 1, 2))(*args)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert io.loads == sum(simulate(schedule).reads[1:]) and io.prefetched == 0


def test_a_host_callback_result_is_copied_into_the_program():
    """The restore callbacks hand XLA read-only views of the store's record
    (load(copy=False)), which stays valid only until a later Delete: XLA
    must copy a callback's results into the program's own buffers when the
    callback returns.  Pinned here, for the JAX version in use."""
    from jax.experimental import io_callback

    buffer = np.arange(64.0, dtype=np.float32)
    view = buffer.view()
    view.flags.writeable = False

    @jax.jit
    def program():
        return io_callback(lambda: view, jax.ShapeDtypeStruct((64,), jnp.float32), ordered=True)

    out = jax.block_until_ready(program())
    buffer[:] = -1.0  # the store reuses the record's memory after its Delete
    np.testing.assert_array_equal(np.asarray(out), np.arange(64.0, dtype=np.float32))
