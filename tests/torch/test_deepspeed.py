"""VlccCheckpointEngine under a real DeepSpeed engine (CPU, one process).

DeepSpeed's first ``initialize`` on a CPU machine compiles a shared-memory
all-reduce op for minutes; one process never uses it, so the test marks it
incompatible (``deepspeed.ops.__compatible_ops__``) and ``initialize`` takes
seconds.
"""

import pytest

torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")

from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402


def _engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)
    )
    config = {
        "train_batch_size": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    return engine


def _step(engine):
    loss = engine(torch.randn(4, 8)).square().sum()
    engine.backward(loss)
    engine.step()


def test_deepspeed_save_and_load_checkpoint_through_the_engine(ds_env, tmp_path):
    engine = _engine()
    vlcc = VlccCheckpointEngine.attach(engine)
    assert engine.checkpoint_engine is vlcc and vlcc.defer
    _step(engine)
    engine.save_checkpoint(str(tmp_path))
    model_ref = {k: v.clone() for k, v in engine.module.state_dict().items()}
    opt_ref = {
        k: {kk: vv.clone() for kk, vv in v.items()}
        for k, v in engine.optimizer.state_dict()["state"].items()
    }
    _step(engine)  # DeepSpeed commits the decoupled checkpoint here
    vlcc.wait()  # `latest` is written once the versions are on disk
    assert (tmp_path / "latest").read_text() == "global_step1"
    pointer = VlccCheckpointEngine.read_pointer(
        str(tmp_path / "global_step1" / "mp_rank_00_model_states.pt")
    )
    assert pointer["tag"] == "global_step1"
    _step(engine)
    path, _ = engine.load_checkpoint(str(tmp_path))
    assert path is not None
    for k, v in engine.module.state_dict().items():
        assert torch.equal(v, model_ref[k]), k
    state = engine.optimizer.state_dict()["state"]
    for k in opt_ref:
        for kk in opt_ref[k]:
            assert torch.equal(state[k][kk], opt_ref[k][kk]), (k, kk)
    # A second engine (a restarted job) reads the same files.
    fresh = _engine()
    fresh.checkpoint_engine = VlccCheckpointEngine()
    path, _ = fresh.load_checkpoint(str(tmp_path))
    for k, v in fresh.module.state_dict().items():
        assert torch.equal(v, model_ref[k]), k
    engine.destroy()
    fresh.destroy()
