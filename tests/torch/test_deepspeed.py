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


_NEVER_CLOSED = """
import atexit, sys, threading
atexit.register(lambda: print("alive at exit:", sorted(t.name for t in threading.enumerate())))
import torch
from vlcc_adjoint.torch import VlccCheckpointEngine
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
engine = VlccCheckpointEngine(sys.argv[1], model=model)  # deferred capture: threads
engine.guard(opt)
for k in range(3):
    engine.save({"w": model.weight, "k": k}, sys.argv[2] + str(k))
    model(torch.randn(2, 64)).sum().backward()
    opt.step()  # commits the save first
    opt.zero_grad()
torch.save(model.weight.detach().clone(), sys.argv[2] + "ref")
# no close(): the engine's threads are joined at exit, the last version written
"""


def test_an_engine_never_closed_finishes_its_writes_and_joins_its_threads_at_exit(tmp_path):
    import subprocess
    import sys

    pointer = str(tmp_path / "ckpt")
    out = subprocess.run(
        [sys.executable, "-c", _NEVER_CLOSED, str(tmp_path / "history"), pointer],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "alive at exit: ['MainThread']" in out.stdout, out.stdout
    reader = VlccCheckpointEngine()
    states = [reader.load(pointer + str(k)) for k in range(3)]
    reader.close()
    assert [s["k"] for s in states] == [0, 1, 2]
    assert not torch.equal(states[1]["w"], states[2]["w"])  # each save before its step
    final = torch.load(pointer + "ref", weights_only=True)
    assert not torch.equal(states[2]["w"], final)
