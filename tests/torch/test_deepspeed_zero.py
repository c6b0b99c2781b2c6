"""VlccCheckpointEngine against DeepSpeed's own engine, ZeRO stages 0-3 (CPU, one process).

DeepSpeed's checkpoint tests (``tests/unit/checkpoint/test_zero_optimizer.py``)
train a model, save, load into a fresh engine and compare the model and
optimizer states; here every stage also resumes training, and everything is
compared with DeepSpeed's default ``torch.save`` engine doing the same:
the files' contents (every DeepSpeed object in them), the weights and the
optimizer state after loading (bit for bit), and the losses of the next steps.

Also from DeepSpeed's tests: ``client_state``, a DeepSpeed learning-rate
scheduler, ``load_module_only=True`` and ``load_optimizer_states=False``
(not for ZeRO-3, where DeepSpeed reads the files with ``torch.load`` in
``deepspeed.utils.zero_to_fp32`` instead of through the checkpoint engine).

A client ``torch.optim.Adam`` (no compiled ops), world size 1 on gloo; in
fp32, in fp16 (DeepSpeed's fp16 optimizers with their dynamic loss scaler,
whose scale has grown from its initial value by the save) and in
bf16.  Two processes: ``test_deepspeed_dist.py``.
"""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")

from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state  # noqa: E402

from vlcc_adjoint import state as vstate  # noqa: E402
from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402

ADAM_KEYS = ("exp_avg", "exp_avg_sq")


#: DeepSpeed's mixed-precision settings: fp16 with its dynamic loss scaler
#: (a window of 2 steps, so that the scale has grown, and the scaler's state
#: is not the initial one, when the checkpoint is saved) and bf16.
PRECISIONS = {
    "fp32": {},
    "fp16": {"fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2}},
    "bf16": {"bf16": {"enabled": True}},
}


def _engine(stage, seed=0, precision="fp32", **zero):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    config = {
        "train_batch_size": 4,
        "zero_optimization": {"stage": stage, **zero},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 1e-2}},
        **PRECISIONS[precision],
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(n)]


def _train(engine, batches):
    losses = []
    dtype = next(engine.module.parameters()).dtype  # fp16/bf16 modules take their dtype
    for x, y in batches:
        x, y = x.to(dtype), y.to(dtype)
        loss = (engine(x) - y).square().float().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _snapshot(engine):
    """The full fp32 weights and Adam moments, per parameter name (any ZeRO stage);
    without ZeRO in fp16, whose optimizer keeps the moments of its own fp32
    master copies, the optimizer's state dict (master weights, moments, loss
    scaler) instead of the moments."""
    out = {}
    opt = engine.optimizer
    for name, p in engine.module.named_parameters():
        w = safe_get_full_fp32_param(p)
        out[name] = (p.detach() if w is None else w).clone()
        for key in ADAM_KEYS:
            s = safe_get_full_optimizer_state(p, key)
            if s is None and p not in opt.state:
                out["optimizer"] = _clone(opt.state_dict())
                continue
            out[f"{name}.{key}"] = (opt.state[p][key] if s is None else s).clone()
    return out


def _loaded(engine):
    """The weights and the optimizer's state dict right after a load (ZeRO 1-2 link
    their moments to the parameters only at the next step)."""
    weights = {}
    for name, p in engine.module.named_parameters():
        w = safe_get_full_fp32_param(p) if hasattr(p, "ds_id") else None
        weights[name] = (p.detach() if w is None else w).clone()
    return weights, _clone(engine.optimizer.state_dict())


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, _clone(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return copy.copy(obj)


def _assert_same_state(a, b, path="state"):
    """`a` and `b` hold the same types and values, tensors bit for bit."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        # The same keys, in any order: a dict's order is not part of the state (and
        # DeepSpeed's universal checkpoint builds the moments' dicts in the order
        # os.listdir gives their files).
        assert set(a) == set(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            _assert_same_state(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{path}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        _assert_same_state(vars(a), vars(b), f"{path}.__dict__")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize(
    "stage, zero, precision, wait_on_commit",
    [
        (0, {}, "fp32", "captured"),
        (1, {}, "fp32", "captured"),
        (2, {}, "fp32", "captured"),
        (2, {"round_robin_gradients": True}, "fp32", "captured"),
        (3, {}, "fp32", "captured"),
        (0, {}, "fp16", "captured"),
        (1, {}, "fp16", "captured"),
        (3, {}, "fp16", "captured"),
        (0, {}, "bf16", "captured"),
        (2, {}, "bf16", "captured"),
        (3, {}, "bf16", "captured"),
        (1, {}, "fp32", "written"),  # chunks written from the live tensors, no copy
        (3, {}, "bf16", "written"),
    ],
)
def test_zero_stage_saves_reloads_and_resumes_like_deepspeeds_own_engine(
    ds_env, tmp_path, stage, zero, precision, wait_on_commit
):
    batches = _batches(5)
    run = _engine(stage, precision=precision, **zero)
    _train(run, batches[:2])
    client = {"epoch": 3, "note": "warmup", "rng": torch.get_rng_state()}
    run.save_checkpoint(str(tmp_path / "torch"), tag="t", client_state=client)  # the default
    vlcc = VlccCheckpointEngine.attach(run, wait_on_commit=wait_on_commit)
    run.save_checkpoint(str(tmp_path / "vlcc"), tag="t", client_state=client)
    vlcc.wait()
    saved_loaded = _loaded(run)
    run_sched = run.lr_scheduler.state_dict()
    losses = _train(run, batches[2:])  # the reference continuation
    vlcc.close()

    # Every file holds the same objects, of the same types, with the same values.
    files = sorted(os.listdir(tmp_path / "torch" / "t"))
    assert files == sorted(os.listdir(tmp_path / "vlcc" / "t"))
    assert any("optim_states" in f for f in files) == (stage > 0)
    reader = VlccCheckpointEngine()
    for f in files:
        ours = reader.load(str(tmp_path / "vlcc" / "t" / f))
        theirs = torch.load(tmp_path / "torch" / "t" / f, weights_only=False)
        _assert_same_state(ours, theirs, f)
    reader.close()

    # Fresh engines (other initial weights) load, then train on: bit-equal throughout.
    resumed, module_only = {}, {}
    for kind in ("torch", "vlcc"):
        fresh = _engine(stage, seed=1, precision=precision, **zero)
        if kind == "vlcc":
            fresh.checkpoint_engine = VlccCheckpointEngine()
        path, got_client = fresh.load_checkpoint(str(tmp_path / kind), tag="t")
        assert path is not None
        _assert_same_state({k: got_client[k] for k in client}, client, kind)
        _assert_same_state(_loaded(fresh), saved_loaded, kind)
        assert fresh.lr_scheduler.state_dict() == run_sched
        assert _train(fresh, batches[2:]) == losses, kind
        resumed[kind] = _snapshot(fresh)
        if kind == "vlcc":
            fresh.checkpoint_engine.close()
        fresh.destroy()
    _assert_same_state(resumed["vlcc"], resumed["torch"], "resumed")

    # DeepSpeed's load_module_only / load_optimizer_states=False read the same.
    for kind in ("torch", "vlcc"):
        fresh = _engine(stage, seed=2, precision=precision, **zero)
        if kind == "vlcc":
            fresh.checkpoint_engine = VlccCheckpointEngine()
        fresh.load_checkpoint(str(tmp_path / kind), tag="t", load_module_only=True)
        module_only[kind] = _loaded(fresh)[0]
        if stage < 3:  # ZeRO-3 module-only loading expects models built under zero.Init
            _assert_same_state(module_only[kind], saved_loaded[0], kind)
        if stage < 3:
            # (ZeRO-3 without optimizer states reads the files with torch.load in
            # deepspeed.utils.zero_to_fp32, not through the checkpoint engine.)
            fresh.load_checkpoint(str(tmp_path / kind), tag="t", load_optimizer_states=False)
            _assert_same_state(_loaded(fresh)[0], saved_loaded[0], kind)
        if kind == "vlcc":
            fresh.checkpoint_engine.close()
        fresh.destroy()
    _assert_same_state(module_only["vlcc"], module_only["torch"])
    run.destroy()


def test_deepspeed_objects_round_trip_as_plain_data_and_unknown_ones_are_refused():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    VlccCheckpointEngine()  # registers the DeepSpeed providers
    dyn = DynamicLossScaler(
        init_scale=2.0**16,
        scale_window=1000,
        min_scale=1.0,
        delayed_shift=2,
        consecutive_hysteresis=False,
        dtype=torch.half,
    )
    dyn.update_scale(True)
    state = {
        "static": LossScaler(scale=4.0),
        "dynamic": dyn,
        "stage": ZeroStageEnum.weights,
        "slices": [{"w": fragment_address(numel=12, start=3)}],
    }
    leaves, spec = vstate.flatten(state)
    back = vstate.unflatten(spec, leaves)
    _assert_same_state(back, state)
    assert back["dynamic"].loss_scale == dyn.loss_scale and back["stage"] is ZeroStageEnum.weights
    text = repr(spec)
    assert "pickle" not in text and "__reduce__" not in text

    # A crafted spec cannot smuggle in other attribute values or names.
    node = spec["tree"]["items"][0]
    bad = {
        **spec,
        "tree": {
            **spec["tree"],
            "items": [
                {**node, "items": [{"dict": ["__class__"], "items": [{"value": 1}]}]},
                *spec["tree"]["items"][1:],
            ],
        },
    }
    with pytest.raises(ValueError, match="attribute"):
        vstate.unflatten(bad, leaves)
    enum_bad = {
        **spec,
        "tree": {
            **spec["tree"],
            "items": [
                *spec["tree"]["items"][:2],
                {"type": "deepspeed.ZeroStageEnum", "aux": 7, "items": []},
                spec["tree"]["items"][3],
            ],
        },
    }
    with pytest.raises(ValueError):
        vstate.unflatten(enum_bad, leaves)
    unknown = {
        "format": spec["format"],
        "leaves": [],
        "tree": {"type": "deepspeed.runtime.engine.DeepSpeedEngine", "aux": None, "items": []},
    }
    with pytest.raises(vstate.UnknownStateTypeError, match="not registered|has not"):
        vstate.unflatten(unknown, [])


def test_a_fresh_process_reads_deepspeed_objects_without_importing_deepspeed_first(tmp_path):
    import subprocess
    import sys

    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    writer = VlccCheckpointEngine(str(tmp_path / "history"), defer=False)
    path = str(tmp_path / "optim_states.pt")
    writer.save(
        {
            "loss_scaler": LossScaler(scale=8.0),
            "zero_stage": ZeroStageEnum.gradients,
            "w": torch.arange(3.0),
        },
        path,
    )
    writer.close()
    code = (
        "import sys, vlcc_adjoint.torch as vt\n"
        "assert 'deepspeed' not in sys.modules\n"
        f"state = vt.VlccCheckpointEngine().load({path!r})\n"
        "s = state['loss_scaler']\n"
        "print(type(s).__module__, type(s).__name__, s.cur_scale, repr(state['zero_stage']),\n"
        "      state['w'].tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == (
        "deepspeed.runtime.fp16.loss_scaler LossScaler 8.0 "
        "<ZeroStageEnum.gradients: 2> [0.0, 1.0, 2.0]"
    )


@pytest.mark.parametrize("stage", [1, 2])
def test_resharding_a_one_rank_checkpoint_onto_one_rank_is_deepspeeds_own_load(
    ds_env, tmp_path, stage
):
    # load_zero_resharded merges the ranks' partitions and splits them anew: with
    # one rank saved and one loading, that is the identity, so it must load what
    # DeepSpeed's load_checkpoint loads, bit for bit (2 ranks onto 1:
    # test_deepspeed_dist.py, against DeepSpeed's universal checkpoint).
    from vlcc_adjoint.torch import load_zero_resharded

    batches = _batches(4)
    run = _engine(stage)
    _train(run, batches[:2])
    VlccCheckpointEngine.attach(run)
    run.save_checkpoint(str(tmp_path), tag="t")
    run.checkpoint_engine.close()
    run.destroy()
    got = {}
    for how in ("deepspeed", "resharded"):
        fresh = _engine(stage, seed=1)
        fresh.checkpoint_engine = VlccCheckpointEngine()
        if how == "deepspeed":
            fresh.load_checkpoint(str(tmp_path), tag="t")
        else:
            load_zero_resharded(fresh, str(tmp_path), tag="t")
        got[how] = (_loaded(fresh), _train(fresh, batches[2:]))
        fresh.checkpoint_engine.close()
        fresh.destroy()
    _assert_same_state(got["resharded"][0], got["deepspeed"][0])
    assert got["resharded"][1] == got["deepspeed"][1]


def test_resharding_refuses_what_it_cannot_read(ds_env, tmp_path):
    from vlcc_adjoint.errors import VlccFileNotFoundError, VlccValueError
    from vlcc_adjoint.torch import load_zero_resharded

    run = _engine(1)
    _train(run, _batches(1))
    run.save_checkpoint(str(tmp_path), tag="t")  # DeepSpeed's torch.save engine
    (tmp_path / "t" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    fresh = _engine(1, seed=1)
    with pytest.raises(VlccFileNotFoundError, match="optimizer files of ranks"):
        load_zero_resharded(fresh, str(tmp_path), tag="t")
    with pytest.raises(VlccValueError, match="ZeRO stage 1 or 2"):
        load_zero_resharded(_engine(0, seed=1), str(tmp_path), tag="t")
    fresh.destroy()
    run.destroy()
