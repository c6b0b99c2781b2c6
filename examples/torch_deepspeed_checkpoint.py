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
    python examples/torch_deepspeed_checkpoint.py --dir ds-run   # keep the checkpoints

Without DeepSpeed installed, the same engine runs a plain PyTorch loop
(``engine.guard(optimizer)`` plays DeepSpeed's part).  Without ``--dir``
the checkpoints live in a temporary directory, removed at the end.
"""

import os

import torch

from vlcc_adjoint.cli import Integer, Parser, work_directory
from vlcc_adjoint.lineage import History
from vlcc_adjoint.torch import VlccCheckpointEngine

#: What a run writes in its checkpoint directory: DeepSpeed's ``latest``
#: file and the lineage history (plus one ``global_stepN`` folder per save).
RESULTS = ("latest", "vlcc-history")


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=Integer(1), default=30, help="training steps")
    parser.add_argument("--every", type=Integer(1), default=10, help="a checkpoint every k steps")
    parser.add_argument(
        "--port", type=Integer(1, 65535), default=29561, help="DeepSpeed's rendezvous port"
    )
    parser.add_argument(
        "--dir",
        help="checkpoint directory, kept (created if missing; default: a temporary "
        "directory, removed at the end)",
    )
    return parser


def train_deepspeed(deepspeed, model, ckpt: str, args) -> str:
    """DeepSpeed's own loop, with the vlcc engine attached; returns the tag loaded back."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.port),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
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
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64)
        loss = (engine(x) - x.sum(1, keepdim=True)).square().mean()
        engine.backward(loss)
        engine.step()
        if step % args.every == 0:
            engine.save_checkpoint(ckpt)  # unchanged
            print(f"step {step}: loss {loss.item():.3f}, checkpoint global_step{step} saved")
    engine.checkpoint_engine.wait()  # commit the last one too
    path, _ = engine.load_checkpoint(ckpt)  # unchanged
    print("loaded", path)
    engine.destroy()  # closes the checkpoint engine too
    torch.distributed.destroy_process_group()
    return str(path)


def train_plain(model, ckpt: str, args) -> str:
    """The same engine in a plain PyTorch loop; returns the tag restored."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ce = VlccCheckpointEngine(model=model, optimizer=opt)
    ce.guard(opt)

    class Info:
        save_dir, save_latest = ckpt, True

    last = None
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64)
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % args.every == 0:
            Info.tag = last = f"global_step{step}"
            ce.create(Info)
            os.makedirs(os.path.join(ckpt, Info.tag), exist_ok=True)
            ce.save(
                {"module": model.state_dict(), "optimizer": opt.state_dict()},
                os.path.join(ckpt, Info.tag, "mp_rank_00_model_states.pt"),
            )
    ce.close()
    state = ce.load(os.path.join(ckpt, str(last), "mp_rank_00_model_states.pt"))
    model.load_state_dict(state["module"])
    print(f"restored {last}")
    return str(last)


def main(argv=None) -> str:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.every > args.steps:
        parser.error(f"--every {args.every} is more than --steps {args.steps}: no checkpoint")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    try:
        import deepspeed
    except ImportError:
        deepspeed = None
    with work_directory(parser, args.dir, *RESULTS) as ckpt:
        if deepspeed is not None:
            loaded = train_deepspeed(deepspeed, model, ckpt, args)
        else:
            loaded = train_plain(model, ckpt, args)
        with History(os.path.join(ckpt, "vlcc-history"), mode="r") as history:
            print(history.draw())
    if args.dir:
        print(f"the checkpoints are kept in {args.dir}")
    return loaded


if __name__ == "__main__":
    main()
