"""Repeated training checkpoints hold no growing host memory, and staging stays bounded.

Users of checkpoint libraries report host memory growing from save to save
(a ``dcp.async_save`` leak; Orbax holding several copies of the state).  Here
a model-sized state (8 MiB, about 1% of it changed before each save, as an
optimizer step at a low learning rate would not be, but deduplication sees)
is saved many times through :class:`~vlcc_adjoint.torch.dcp.VlccWriter`, with
``dcp.save`` and with ``dcp.async_save``, and through
:class:`~vlcc_adjoint.torch.VlccCheckpointEngine` (the DeepSpeed engine,
driven as DeepSpeed does: ``save`` then ``commit`` before the next step).

The measure is Python's ``tracemalloc`` (every NumPy buffer the history's
writer allocates is traced), taken after a warm-up that fills the reused
buffers and pools: over the following saves it may grow by at most 1% of the
state.  What does grow is the history's table of versions (about half a
KiB of metadata per version, whatever the state's size, see
``tests/lineage/test_lineage_memory.py``), which is what the bound leaves
room for.  The staging area of ``dcp.async_save``
(torch memory, not traced) is checked through its own accounting: at most
1.25x the shard, one allocation for all saves.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402
from vlcc_adjoint.torch.dcp import VlccWriter  # noqa: E402

WARMUP = 6
SAVES = 24


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(256, 1024, generator=g) for i in range(8)}
    state["layer0.bias"] = torch.randn(256, generator=g)
    state["step"] = torch.tensor(0)
    return state


def _state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _change(state: dict, k: int) -> None:
    """About 1% of the state's elements change, in one weight, and the step."""
    w = state[f"layer{k % 8}.weight"].view(-1)
    n = _state_bytes(state) // 4 // 100
    start = (k * 9973) % (w.numel() - n)
    w[start : start + n].add_(1.0)
    state["step"].add_(1)


@pytest.fixture(autouse=True)
def _no_kept_log_records():
    """DCP logs every step at DEBUG; pytest's log capture keeps each record (a
    memory growth of the test harness, not of the saves): not for these tests."""
    saved = logging.root.manager.disable
    logging.disable(logging.DEBUG)
    yield
    logging.disable(saved)


def _growth(save, state: dict) -> int:
    """Bytes of traced memory gained over SAVES saves after WARMUP saves."""
    tracemalloc.start(1)
    try:
        for k in range(WARMUP + SAVES):
            if k == WARMUP:
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
            _change(state, k)
            save(state, k)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("mode", ["save", "async_save"])
def test_repeated_dcp_saves_hold_no_growing_memory_and_staging_is_bounded(tmp_path, mode):
    state = _state()
    writer = VlccWriter(tmp_path / "h", message="step")

    def save(sd, k):
        writer.step = k
        if mode == "save":
            dcp.save(sd, storage_writer=writer)
        else:
            dcp.async_save(sd, storage_writer=writer).result()

    grown = _growth(save, state)
    assert grown <= 0.01 * _state_bytes(state), f"{grown} bytes over {SAVES} saves"
    if mode == "async_save":
        staging = writer.staging
        assert staging.shard_bytes == _state_bytes(state)
        assert staging.nbytes <= 1.25 * staging.shard_bytes
        assert staging.reallocations == 1 and staging.saves == WARMUP + SAVES
    writer.close()


def test_repeated_engine_checkpoints_hold_no_growing_memory(tmp_path):
    state = _state()
    engine = VlccCheckpointEngine(tmp_path / "history", defer=False)

    def save(sd, k):
        engine.save(sd, str(tmp_path / f"ckpt{k % 2}.pt"))
        engine.commit()
        engine.wait()

    grown = _growth(save, state)
    assert grown <= 0.01 * _state_bytes(state), f"{grown} bytes over {SAVES} saves"
    engine.close()


def test_the_memory_bound_fails_on_a_growing_cache(tmp_path):
    # The measure sees a writer that keeps every save's bytes (the bug class it guards).
    state = _state()
    kept = []

    def save(sd, k):
        kept.append(sd["layer0.weight"].numpy().copy()[:2048])  # 8 KiB per save, traced

    assert _growth(save, state) > 0.01 * _state_bytes(state)
