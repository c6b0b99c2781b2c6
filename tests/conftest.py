"""Fixtures shared by several test modules."""

import os
import socket

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ds_env():
    """The environment of a one-process DeepSpeed group on gloo (CPU).

    The process group outlives the module: DeepSpeed's comm layer keeps the
    first one it saw, so a group destroyed here would break the next module
    that initialises DeepSpeed.  DeepSpeed's first ``initialize`` on a CPU
    machine compiles a shared-memory all-reduce op for minutes; one process
    never uses it, so it is marked incompatible for the module's duration.
    """
    deepspeed = pytest.importorskip("deepspeed")
    old = dict(os.environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )  # the port serves the first group only
    saved = deepspeed.ops.__compatible_ops__.get("deepspeed_shm_comm")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    yield
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = saved
    os.environ.clear()
    os.environ.update(old)


@pytest.fixture
def x64():
    """JAX in float64 for one test.  The global flag, not the thread-local
    ``jax.enable_x64`` context: host callbacks run on XLA's threads and must
    see float64 too."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
