"""Asynchronous, versioned DeepSpeed checkpoints in two lines.

``VlccCheckpointEngine.attach(model_engine)`` replaces DeepSpeed's
``torch.save`` engine: ``save_checkpoint`` returns after a memory copy (or,
for weights and optimizer state, before it: they are copied during the next
forward/backward pass), chunks are deduplicated and written by a background
thread into a lineage ``History`` next to the checkpoints, and DeepSpeed's
own ``load_checkpoint`` reads them back, without pickle.  The loop's code
does not change.

Run (DeepSpeed on CPU: ``DS_BUILD_OPS=0 pip install deepspeed``)::

    python examples/torch_deepspeed_checkpoint.py

Without DeepSpeed installed, the same engine runs a plain PyTorch loop
(``engine.guard(optimizer)`` plays DeepSpeed's part).
"""

import os
import tempfile

import torch

from vlcc_adjoint.torch import VlccCheckpointEngine

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
ckpt = tempfile.mkdtemp(prefix="ds-ckpt-")

try:
    import deepspeed
except ImportError:
    deepspeed = None

if deepspeed is not None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    # One process: DeepSpeed's shared-memory all-reduce op is not needed (it compiles for minutes).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = {
        "train_batch_size": 32,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    VlccCheckpointEngine.attach(engine)  # <- the whole setup
    for step in range(1, 31):
        x = torch.randn(32, 64)
        loss = (engine(x) - x.sum(1, keepdim=True)).square().mean()
        engine.backward(loss)
        engine.step()
        if step % 10 == 0:
            engine.save_checkpoint(ckpt)  # unchanged
            print(f"step {step}: loss {loss.item():.3f}, checkpoint global_step{step} saved")
    engine.checkpoint_engine.wait()  # commit the last one too
    path, _ = engine.load_checkpoint(ckpt)  # unchanged
    print("loaded", path)
    engine.destroy()  # closes the checkpoint engine too
    torch.distributed.destroy_process_group()
else:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ce = VlccCheckpointEngine(model=model, optimizer=opt)
    ce.guard(opt)

    class Info:
        save_dir, save_latest = ckpt, True

    for step in range(1, 31):
        x = torch.randn(32, 64)
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0:
            Info.tag = f"global_step{step}"
            ce.create(Info)
            os.makedirs(os.path.join(ckpt, Info.tag), exist_ok=True)
            ce.save(
                {"module": model.state_dict(), "optimizer": opt.state_dict()},
                os.path.join(ckpt, Info.tag, "mp_rank_00_model_states.pt"),
            )
    ce.close()
    state = ce.load(os.path.join(ckpt, "global_step30", "mp_rank_00_model_states.pt"))
    model.load_state_dict(state["module"])
    print("restored global_step30")

from vlcc_adjoint.lineage import History  # noqa: E402

with History(os.path.join(ckpt, "vlcc-history"), mode="r") as history:
    print(history.draw())
