"""The DCP backend across processes: save on 2 ranks, load on 3 and on 1 (gloo, CPU).

The state is a model's parameters and Adam-like optimizer state as DTensors
sharded on a CPU device mesh (``Shard(0)``; one of them ``Shard(1)``), plus plain replicated tensors
and non-tensor items.  Every tensor is generated from a seed on every rank,
so each process knows the originals and checks what it restored against
them (``full_tensor()`` gathers a DTensor).
"""

from __future__ import annotations

import socket
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch built without distributed", allow_module_level=True)

import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from vlcc_adjoint.lineage import History  # noqa: E402
from vlcc_adjoint.torch.dcp import VlccReader, VlccWriter  # noqa: E402

SHAPES = {"embed": (11, 6), "proj": (7, 5), "bias": (5,)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _originals(version: int) -> dict:
    """The full tensors of save `version` (the same in every process)."""
    g = torch.Generator().manual_seed(1234 + version)
    out = {}
    for name, shape in SHAPES.items():
        out[f"model.{name}"] = torch.randn(shape, generator=g)
        out[f"exp_avg.{name}"] = torch.randn(shape, generator=g)
        out[f"exp_avg_sq.{name}"] = torch.rand(shape, generator=g)
    out["rep"] = torch.randn(4, 3, generator=g).to(torch.bfloat16)
    out["step"] = torch.tensor(float(10 + version))  # 0-d
    return out


def _state(full: dict, mesh, shard: bool) -> dict:
    """A state dict over `full` (DTensors sharded on `mesh` when `shard`)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    def place(t):
        if not shard:
            return t.clone()
        return distribute_tensor(t, mesh, [Shard(1) if t.shape == SHAPES["proj"] else Shard(0)])

    return {
        "model": {n: place(full[f"model.{n}"]) for n in SHAPES},
        "optim": {
            "state": {
                n: {
                    "exp_avg": place(full[f"exp_avg.{n}"]),
                    "exp_avg_sq": place(full[f"exp_avg_sq.{n}"]),
                    "step": full["step"].clone(),
                }
                for n in SHAPES
            },
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": list(SHAPES)}],
        },
        "rep": full["rep"].clone(),
        "epoch": 3,
    }


def _zeros_like(sd):
    if isinstance(sd, torch.Tensor):
        from torch.distributed.tensor import DTensor

        if isinstance(sd, DTensor):
            return DTensor.from_local(
                torch.zeros_like(sd.to_local()),
                sd.device_mesh,
                sd.placements,
                shape=sd.shape,
                stride=sd.stride(),
            )
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return {k: _zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_zeros_like(v) for v in sd]
    return sd if isinstance(sd, tuple) else None


def _check(sd: dict, full: dict, epoch: int = 3) -> None:
    from torch.distributed.tensor import DTensor

    def whole(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    for n in SHAPES:
        assert torch.equal(whole(sd["model"][n]), full[f"model.{n}"]), n
        st = sd["optim"]["state"][n]
        assert torch.equal(whole(st["exp_avg"]), full[f"exp_avg.{n}"]), n
        assert torch.equal(whole(st["exp_avg_sq"]), full[f"exp_avg_sq.{n}"]), n
        assert st["step"].shape == () and torch.equal(st["step"], full["step"]), n
    assert sd["optim"]["param_groups"] == [
        {"lr": 0.01, "betas": (0.9, 0.999), "params": list(SHAPES)}
    ]
    assert torch.equal(sd["rep"], full["rep"]) and sd["epoch"] == epoch


def _init(rank: int, world: int, port: int):
    warnings.simplefilter("ignore")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


class _FailOnRank1(VlccWriter):
    def write_data(self, plan, planner):
        if dist.get_rank() == 1:
            self.staging.release()
            raise OSError("no space left on device (rank 1)")
        return super().write_data(plan, planner)


def _save_worker(rank: int, world: int, port: int, path: str) -> None:
    mesh = _init(rank, world, port)
    try:
        # Version 0: a synchronous save of the sharded state.
        writer = VlccWriter(path, message="v0", step=0)
        dcp.save(_state(_originals(0), mesh, True), storage_writer=writer)
        first = writer.version if rank == 0 else None
        # A save in which rank 1 fails: no version, on any rank.
        with pytest.raises(dcp.api.CheckpointException, match="no space left"):
            dcp.save(_state(_originals(9), mesh, True), storage_writer=_FailOnRank1(path))
        dist.barrier()
        if rank == 0:
            with History(path, mode="r") as h:
                assert [v.id for v in h.log()] == [first]
        # Version 1: dcp.async_save, staged into the writer's one reusable area; its
        # chunks stored as deltas against version 0's (each rank finds its bases).
        writer = VlccWriter(path, message="v1", step=1, deltas=True)
        sd = _state(_originals(1), mesh, True)
        fut = dcp.async_save(sd, storage_writer=writer)
        local = sum(
            t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in _tensors(sd)
        )
        assert writer.staging.shard_bytes == local and writer.staging.nbytes <= 1.25 * local
        _zero_in_place(sd)  # training goes on: the staged copy is what is saved
        fut.result()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _tensors(sd):
    if isinstance(sd, torch.Tensor):
        yield sd
    elif isinstance(sd, dict):
        for v in sd.values():
            yield from _tensors(v)
    elif isinstance(sd, list):
        for v in sd:
            yield from _tensors(v)


def _zero_in_place(sd):
    with torch.no_grad():
        for t in _tensors(sd):
            (t.to_local() if hasattr(t, "to_local") else t).zero_()


def _load_worker(rank: int, world: int, port: int, path: str) -> None:
    mesh = _init(rank, world, port)
    try:
        for ref, version in (("main~1", 0), ("main", 1)):
            sd = _zeros_like(_state(_originals(version), mesh, True))
            sd["epoch"] = -1
            dcp.load(sd, storage_reader=VlccReader(path, ref=ref))
            _check(sd, _originals(version))
    finally:
        dist.destroy_process_group()


def _spawn(fn, world: int, path: str) -> None:
    mp.spawn(fn, args=(world, _free_port(), path), nprocs=world, join=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "run.vlcc")
    _spawn(_save_worker, 2, path)
    return path


def test_two_ranks_save_one_version_each_and_a_failed_rank_adds_none(saved):
    with History(saved, mode="r") as h:
        log = h.log()
        assert [v.message for v in log] == ["v1", "v0"]
        assert log[0].parents == (log[1].id,)
        assert [v.meta["dcp"]["ranks"] for v in log] == [2, 2]
        names = set(h.load(log[1].id)["items"])
        assert {"__pack__.0.0", "__pack__.1.0"} <= names  # each rank's small chunks


def test_sharded_save_from_two_ranks_loads_on_three(saved):
    _spawn(_load_worker, 3, saved)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_save_from_two_ranks_loads_on_one_process_into_plain_tensors(saved):
    for ref, version in (("main~1", 0), ("main", 1)):
        full = _originals(version)
        sd = _zeros_like(_state(full, None, False))
        sd["epoch"] = -1
        dcp.load(sd, storage_reader=VlccReader(saved, ref=ref))
        _check(sd, full)
        assert np.isfinite(sd["model"]["embed"].numpy()).all()
