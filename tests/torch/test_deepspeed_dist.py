"""VlccCheckpointEngine under DeepSpeed on 2 processes (gloo, CPU), ZeRO stages 1-3,
in fp32, fp16 (with its dynamic loss scaler) and bf16.

ZeRO exists to shard the optimizer state (stage 1), the gradients (2) and the
weights (3) across data-parallel ranks, so its checkpoints are written by
several processes into one directory, and ours by several processes into one
History.  Two processes (launched here as DeepSpeed's launcher would: ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``) train a tiny model and, for each
stage, save with DeepSpeed's default ``torch.save`` engine and with ours; fresh
engines load each checkpoint and train on.  Checked as in
``test_deepspeed_zero.py``: every file holds the same objects (on rank 0), the
reloaded weights and optimizer state are bit for bit those saved, and the next
losses are the reference continuation's, on every rank.

The processes never close the engine (a training script often does not):
both must exit with status 0 (a background thread alive at interpreter exit
used to end them in SIGABRT).  Last, a history that one rank cannot open
stops both ranks with an error at ``save_checkpoint`` (no rank waits forever
in DeepSpeed's next collective).  Then one process loads the ZeRO-1/2
checkpoints: the weights alone (``load_module_only``, as DeepSpeed's engine
does), and everything, optimizer state included, through our resharding
(:func:`vlcc_adjoint.torch.load_zero_resharded`; DeepSpeed's engine refuses to
repartition the optimizer state onto another world size), compared bit for bit,
and by the next losses, with DeepSpeed's own way: its universal checkpoint
(``ds_to_universal``) of the ``torch.save`` checkpoint, loaded with
``load_universal``.

This file is also the worker: ``python test_deepspeed_dist.py <out dir>``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")

STAGES = (1, 2, 3)
#: (ZeRO stage, precision) of the runs on two processes.
RUNS = [(stage, precision) for precision in ("fp32", "fp16", "bf16") for stage in STAGES]
#: Those whose checkpoint one process loads whole, through our resharding (DeepSpeed
#: runs ZeRO-1 in bf16 with another optimizer, BF16_Optimizer, not ZeRO's).
RESHARDED = [(1, "fp32"), (2, "fp32"), (1, "fp16"), (2, "fp16"), (2, "bf16")]
WORLD = 2


def _engine(
    stage: int, seed: int = 0, world: int = WORLD, precision: str = "fp32", universal=False
):
    from test_deepspeed_zero import PRECISIONS

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    config = {
        "train_batch_size": 4 * world,
        "zero_optimization": {"stage": stage},
        **PRECISIONS[precision],
    }
    if universal:
        config["checkpoint"] = {"load_universal": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _root(out: str, stage: int, precision: str) -> str:
    return os.path.join(out, f"zero{stage}-{precision}")


def _batches(n: int, rank: int):
    g = torch.Generator().manual_seed(1 + rank)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(n)]


def _stage(stage: int, precision: str, out: str, rank: int) -> None:
    from test_deepspeed_zero import _assert_same_state, _loaded, _train

    from vlcc_adjoint.torch import VlccCheckpointEngine

    root = _root(out, stage, precision)
    batches = _batches(4, rank)
    run = _engine(stage, precision=precision)
    _train(run, batches[:2])
    run.save_checkpoint(os.path.join(root, "torch"), tag="t")  # DeepSpeed's default engine
    VlccCheckpointEngine.attach(run)
    run.save_checkpoint(os.path.join(root, "vlcc"), tag="t")
    saved = _loaded(run)
    losses = _train(run, batches[2:])  # the reference continuation (commits at its first step)
    run.checkpoint_engine.wait()
    torch.distributed.barrier()
    if rank == 0:
        files = sorted(os.listdir(os.path.join(root, "torch", "t")))
        assert files == sorted(os.listdir(os.path.join(root, "vlcc", "t"))), files
        assert sum("optim_states" in f for f in files) == WORLD, files
        reader = VlccCheckpointEngine()
        for f in files:
            ours = reader.load(os.path.join(root, "vlcc", "t", f))
            theirs = torch.load(os.path.join(root, "torch", "t", f), weights_only=False)
            _assert_same_state(ours, theirs, f)
        reader.close()
    for kind in ("torch", "vlcc"):
        fresh = _engine(stage, seed=1, precision=precision)
        if kind == "vlcc":
            fresh.checkpoint_engine = VlccCheckpointEngine()
        path, _ = fresh.load_checkpoint(os.path.join(root, kind), tag="t")
        assert path is not None, kind
        _assert_same_state(_loaded(fresh), saved, f"zero{stage} {precision} {kind} rank {rank}")
        got = _train(fresh, batches[2:])
        assert got == losses, (stage, precision, kind, rank, got, losses)
    # `run` and its engine are left open: the exit must be clean all the same.


def _one_rank_cannot_open(out: str, rank: int) -> None:
    from vlcc_adjoint.errors import VlccRuntimeError
    from vlcc_adjoint.torch import VlccCheckpointEngine

    run = _engine(1)
    _train_one(run, rank)
    history = os.path.join(out, f"fail-history-{rank}")
    if rank == 1:
        with open(history, "w") as f:  # a file where the history's directory should be
            f.write("not a directory")
    run.checkpoint_engine = VlccCheckpointEngine(history)
    try:
        run.save_checkpoint(os.path.join(out, "fail"), tag="t")
    except VlccRuntimeError as err:
        text = str(err)
        assert ("failed on rank(s) [1]" in text) if rank == 0 else ("on rank 1" in text), text
    else:
        raise AssertionError(f"rank {rank}: save_checkpoint did not fail")
    run.checkpoint_engine.close()


def _one_process(out: str) -> None:
    """Load the 2-process ZeRO-1/2 checkpoints on one process.

    The weights alone (``load_module_only``, which DeepSpeed's engine allows):
    through our engine they are DeepSpeed's file's weights, bit for bit.  Then
    everything (:func:`_resharded`)."""
    import warnings

    from vlcc_adjoint.torch import VlccCheckpointEngine

    warnings.simplefilter("ignore")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    for stage in (1, 2):
        root = _root(out, stage, "fp32")
        want = torch.load(
            os.path.join(root, "torch", "t", "mp_rank_00_model_states.pt"), weights_only=False
        )["module"]
        for kind in ("torch", "vlcc"):
            fresh = _engine(stage, seed=1, world=1)
            if kind == "vlcc":
                fresh.checkpoint_engine = VlccCheckpointEngine()
            path, _ = fresh.load_checkpoint(
                os.path.join(root, kind), tag="t", load_module_only=True
            )
            assert path is not None, (stage, kind)
            got = fresh.module.state_dict()
            assert sorted(got) == sorted(want), (stage, kind)
            for k, v in want.items():
                assert torch.equal(got[k], v), (stage, kind, k)
            if kind == "vlcc":
                fresh.checkpoint_engine.close()
    for stage, precision in RESHARDED:
        _resharded(out, stage, precision)
    print("one process done", flush=True)


def _resharded(out: str, stage: int, precision: str) -> None:
    """A 2-process ZeRO-1/2 checkpoint, optimizer state included, on one process.

    The reference is DeepSpeed's own path to another world size: its universal
    checkpoint (``ds_to_universal``, with ``--inject_missing_state`` for a model
    that is not Megatron's) of the ``torch.save`` checkpoint, loaded by an
    engine with ``load_universal``.  Our resharding (:func:`load_zero_resharded`)
    loads the checkpoint saved through our engine, and the ``torch.save`` one
    through DeepSpeed's engine: the weights, the optimizer's state dict (master
    weights, moments, step, loss scaler) and the losses of the next steps are
    the reference's, bit for bit.  DeepSpeed's own engine refuses the load."""
    from deepspeed.runtime.zero.utils import ZeRORuntimeException
    from test_deepspeed_zero import _assert_same_state, _loaded, _train

    from vlcc_adjoint.torch import VlccCheckpointEngine, load_zero_resharded

    root = _root(out, stage, precision)
    universal = os.path.join(root, "universal")
    convert = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            os.path.join(root, "torch", "t"),
            "--output_folder",
            os.path.join(universal, "t"),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
            "--inject_missing_state",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
    )
    assert convert.returncode == 0, convert.stdout[-3000:]
    batches = _batches(3, 0)
    ref = _engine(stage, seed=1, world=1, precision=precision, universal=True)
    path, _ = ref.load_checkpoint(universal, tag="t")
    assert path is not None, (stage, precision)
    want = _loaded(ref)
    want_losses = _train(ref, batches)
    ref.destroy()
    refused = _engine(stage, seed=1, world=1, precision=precision)
    with pytest.raises(ZeRORuntimeException, match="world size"):
        refused.load_checkpoint(os.path.join(root, "torch"), tag="t")
    refused.destroy()
    for kind in ("vlcc", "torch"):
        fresh = _engine(stage, seed=1, world=1, precision=precision)
        if kind == "vlcc":
            fresh.checkpoint_engine = VlccCheckpointEngine()
        path, _ = load_zero_resharded(fresh, os.path.join(root, kind), tag="t")
        assert path is not None, (stage, precision, kind)
        _assert_same_state(_loaded(fresh), want, f"zero{stage} {precision} {kind} resharded")
        got = _train(fresh, batches)
        assert got == want_losses, (stage, precision, kind, got, want_losses)
        if kind == "vlcc":
            fresh.checkpoint_engine.close()
        fresh.destroy()


def _train_one(engine, rank: int) -> None:
    from test_deepspeed_zero import _train

    _train(engine, _batches(1, rank))


def _worker(out: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # never compile it
    rank = int(os.environ["RANK"])
    for stage, precision in RUNS:
        _stage(stage, precision, out, rank)
    _one_rank_cannot_open(out, rank)
    print(f"rank {rank} done", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zero_1_2_3_fp32_fp16_bf16_on_two_processes_match_deepspeeds_engine_and_reshard(
    tmp_path,
):
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(WORLD))
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(tmp_path)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=540)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{text[-4000:]}"
        assert f"rank {r} done" in text, text[-4000:]
        assert "terminate called" not in text, text[-4000:]
    # The weights of those checkpoints, on one process.
    one = subprocess.run(
        [sys.executable, os.path.abspath(__file__), str(tmp_path), "one"],
        env={
            **env,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_PORT": str(_free_port()),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0 and "one process done" in one.stdout, one.stdout[-4000:]


if __name__ == "__main__":
    if sys.argv[2:] == ["one"]:
        _one_process(sys.argv[1])
    else:
        _worker(sys.argv[1])
