"""DeepSpeed: a checkpoint engine that writes a lineage history

`VlccCheckpointEngine.attach(engine)` replaces DeepSpeed's `torch.save`
checkpoint engine.  The training loop does not change: `save_checkpoint`
returns at once: a background thread writes the weights and the optimizer
state from the live tensors during the next forward/backward pass (the next
optimizer step first writes, alongside it, what is left) as deduplicated,
checksummed chunks into a lineage `History` next to the checkpoints, and DeepSpeed's own `load_checkpoint` reads them back, without
pickle.

Here a small model trains with ZeRO stage 1 on CPU (one process, the gloo
backend), saves a checkpoint, trains on; a fresh engine with other initial
weights loads the checkpoint and takes the same steps, with the same
losses, bit for bit.  Install DeepSpeed for CPU with
`DS_BUILD_OPS=0 pip install deepspeed`.
"""

import os
import socket
import tempfile
import warnings

# This page is built with warnings as errors; DeepSpeed's imports use torch
# APIs that torch itself deprecates, which are theirs to fix, not ours.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(torch|deepspeed)\b")
warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|deepspeed)\b")

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no accelerator to look for

import deepspeed  # noqa: E402
import torch  # noqa: E402

from vlcc_adjoint.lineage import History  # noqa: E402
from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402

# One process on CPU: the launcher's environment, by hand.  DeepSpeed's
# shared-memory all-reduce op (which compiles for minutes) is not needed.
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
os.environ.update(
    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
)
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
torch.set_num_threads(1)
config = {"train_batch_size": 8, "zero_optimization": {"stage": 1}}


def make_engine(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def train(engine, batches):
    losses = []
    for x, y in batches:
        loss = (engine(x) - y).square().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(12)]

with tempfile.TemporaryDirectory() as ckpt:
    engine = make_engine(seed=0)
    VlccCheckpointEngine.attach(engine)  # <- the whole setup
    train(engine, batches[:6])
    engine.save_checkpoint(ckpt, client_state={"epoch": 1})  # unchanged DeepSpeed call
    after_save = train(engine, batches[6:])  # the run goes on
    engine.checkpoint_engine.wait()
    print("files:", sorted(os.listdir(os.path.join(ckpt, "global_step6"))))
    engine.destroy()  # closes the checkpoint engine too

    fresh = make_engine(seed=123)  # other initial weights
    fresh.checkpoint_engine = VlccCheckpointEngine()
    path, client = fresh.load_checkpoint(ckpt)  # unchanged DeepSpeed call
    print("loaded", os.path.relpath(path, ckpt), "with client state epoch =", client["epoch"])
    resumed = train(fresh, batches[6:])
    fresh.checkpoint_engine.close()
    fresh.destroy()
    for a, b in zip(after_save, resumed):
        print(f"loss {a:.6f}  resumed {b:.6f}")
    assert resumed == after_save  # bit for bit

    with History(os.path.join(ckpt, "vlcc-history"), mode="r") as history:
        print(history.draw())
torch.distributed.destroy_process_group()
