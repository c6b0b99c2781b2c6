"""Benchmark: torch.distributed.checkpoint into a lineage History, next to DCP's files and icechunk.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_dcp.py --quick                 # about a minute (CI size)
    python benchmarks/bench_dcp.py                         # the committed size, ~8 min
    python benchmarks/bench_dcp.py --train-repeats 5 --update-results   # the committed JSON
    python benchmarks/bench_dcp.py --only-durability --update-results   # that section alone

Writes ``DIR/bench_dcp.json`` (``--out DIR``, default
``$TMPDIR/vlcc-bench-results/``; with ``--update-results``,
``benchmarks/results/``) and prints its tables.

The model is the tiny transformer of ``vlcc_adjoint._examples.tiny_lm``
scaled up (``--d-model``, ``--layers``), trained with AdamW on one thread;
a version is ``{"model": ..., "optim": ...}`` from DCP's ``get_state_dict``
(weights and both Adam moments), saved after every ``--k`` training steps.
The backends (``benchmarks/_dcp_backends.py``): ``vlcc`` (our
``VlccWriter``/``VlccReader``), ``vlcc_deltas`` (the same, repository with
XOR-delta chunks), ``dcp_fs`` (DCP's default ``FileSystemWriter``, one
directory per version), ``icechunk`` (1.1, a zarr array per tensor, every
tensor written each version) and ``icechunk_changed`` (only tensors whose
bytes changed).  ``dcp_fs`` runs with DCP's default ``sync_files=True``
(every file fsynced), ``vlcc`` with ours, which does not fsync; each
backend's ``fsync`` is recorded beside its times.  Two workloads:

* ``full``: full training, every weight (and both moments) changes between
  versions.  Bytes per version against the state's bytes.
* ``adapters``: fine-tuning with a frozen base: LoRA adapters of rank
  ``--rank`` on every linear layer of the blocks are the only trainable
  tensors; the saved state is the whole model plus the adapters' optimizer
  state.  Bytes per version against the *trainable* bytes (adapters and
  their two moments); goal <= 1.1x.

Measured for each (workload, backend), all versions saved first, then read:
``save_s_cold`` (the first save, the store is created), ``save_s_warm``
(median of saves 2..N), ``load_s_cold`` (the first load of the last
version, by fresh reader objects; the page cache is warm: nothing here
drops it), ``load_s_warm`` (median of ``--repeats`` further loads),
``bytes_first`` and ``bytes_per_version`` (growth of the store's files per
later version, each inode once), ``restored_equal`` (the loaded tensors of
the first and last versions equal the saved ones).  Host memory, each in a
fresh process, its record of the peak reset just before the call (Linux
``VmHWM``, reset through ``/proc/self/clear_refs``): the peak resident memory
above the resident memory just before one save into a
new store (``rss_save_bytes``) and one load of the last version
(``rss_load_bytes``), with those calls' times (``*_new_process``).

``durability``: the warm save, like for like: DCP's writer with
``sync_files=True`` against ours with ``durable=True`` (both fsync every
file they write; ours also the directories and references), and
``sync_files=False`` against our default (neither fsyncs), on the ``full``
workload's versions, the four writers interleaved version by version in
rotated order (the machine's load falls on all four alike).  Per backend:
``fsync``, ``setup``, ``save_s`` (every save), ``save_s_cold`` (the first),
``save_s_warm`` (median of the others), ``bytes`` (the store at the end)
and ``restored_equal`` (the last version loads back exactly); ``pairs``
names each comparison's two backends and the ratio of their warm saves
(ours over DCP's).  ``--only-durability`` measures this section alone and
puts it into the results file already in ``--out`` (the other sections and
the ``"claims"`` stay; the section records its own command and machine).

``training``: the slowdown of ``--train-steps`` steps with a checkpoint every
``--k`` steps, against the same steps without any, for ``dcp.save`` and
``dcp.async_save`` (thread; the next save waits for the previous one, the
last one is waited for before the clock stops) with each writer, for
``torch.save`` of the two state dicts into a new file (a plain PyTorch
loop), and, when DeepSpeed is installed, for DeepSpeed's
``engine.save_checkpoint`` with its default ``torch.save`` checkpoint engine
and with our ``VlccCheckpointEngine`` attached (its slowdown against the
same DeepSpeed loop without checkpoints, ``seconds_ds_none``).  Modes run
interleaved, in rotated order, ``--train-repeats`` times; per repeat, the
ratio to that repeat's run without checkpoints (``slowdown``).  On a shared
machine those wall-clock ratios carry the other tenants' noise; two less
noisy measures are kept next to them: ``blocked_fraction``, the time the
loop spent inside the checkpoint calls (waits for the previous async save
included) over the rest of its time (the stall a dedicated core would see;
for async saves it misses the background thread's competition for the CPU),
and ``cpu_overhead``, the process's CPU time (all its threads) over that of
the run without checkpoints.  Each run is a fresh process,
so its peak resident memory above the start of the loop (``rss_peak_bytes``)
is the run's own: the memory checkpointing adds (staging copies included).
The machine is shared: the load average before and after is recorded, and
every ratio is kept.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import _dcp_backends as B  # noqa: E402
import claims  # noqa: E402  (benchmarks/claims.py)
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from bench_lineage import disk_bytes  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402

from vlcc_adjoint._examples import tiny_lm as lm  # noqa: E402

BACKENDS = ["vlcc", "vlcc_deltas", "dcp_fs", "icechunk", "icechunk_changed"]
CONFIG = (
    "d_model",
    "layers",
    "rank",
    "batch",
    "versions",
    "k",
    "repeats",
    "train_steps",
    "train_repeats",
)
#: the like-for-like warm-save comparisons: (ours, DCP's) of the same durability
DURABILITY = {"fsync": ("vlcc_durable", "dcp_fs"), "no_fsync": ("vlcc", "dcp_fs_nosync")}
SETUPS = {
    "vlcc_durable": "VlccWriter(path, durable=True): chunks, directories and refs fsynced",
    "dcp_fs": "FileSystemWriter(dir): sync_files=True (its default), every file fsynced",
    "vlcc": "VlccWriter(path): durable=False (our default), no fsync",
    "dcp_fs_nosync": "FileSystemWriter(dir, sync_files=False): no fsync",
}


def _setup(args, adapters: bool):
    """A model, its optimizer over the trainable tensors, and the trainable bytes."""
    model = lm.TinyLM(
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        adapter_rank=args.rank if adapters else 0,
        seed=0,
    )
    params = lm.freeze_base(model) if adapters else list(model.parameters())
    return model, torch.optim.AdamW(params, weight_decay=0.0)


def _state(model, opt) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _versions(args, adapters: bool) -> tuple[list[dict], int, int]:
    """The states of `args.versions` versions, `args.k` steps apart (deep copies)."""
    data = lm.corpus("addition" if adapters else "grammar", 50_000)
    model, opt = _setup(args, adapters)
    states, step = [], 0
    for _ in range(args.versions):
        for _ in range(args.k):
            lm.train_step(model, opt, *lm.batch(data, step, args.batch), 1e-3)
            step += 1
        states.append(copy.deepcopy(_state(model, opt)))
    tensors, _ = B.flatten(states[-1])
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    trainable = sum(p.numel() * p.element_size() for p in opt.param_groups[0]["params"]) * 3
    return states, total, trainable


def _equal(a: dict, b: dict) -> bool:
    ta, _ = B.flatten(a)
    tb, _ = B.flatten(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def _one_backend(name, states, template, root, repeats) -> dict:
    backend = B.make(name, root)
    n = len(states)
    save_s, after = [], []
    for i, sd in enumerate(states):
        save_s.append(B.timed(backend.save, sd, i))
        after.append(disk_bytes(root))
    load_s = []
    for _ in range(1 + repeats):
        target = copy.deepcopy(template)
        gc.collect()
        load_s.append(B.timed(backend.load, n - 1, target))
    first = copy.deepcopy(template)
    backend.load(0, first)
    backend.close()
    return {
        "save_s_cold": save_s[0],
        "save_s_warm": statistics.median(save_s[1:]),
        "save_s": save_s,
        "load_s_cold": load_s[0],
        "load_s_warm": statistics.median(load_s[1:]),
        "load_s": load_s,
        "bytes_after": after,
        "bytes_first": after[0],
        "bytes_per_version": (after[-1] - after[0]) / (n - 1),
        "restored_equal": _equal(target, states[-1]) and _equal(first, states[0]),
        "ids": [str(i) for i in backend.ids],
        "fsync": backend.fsync,
    }


def _child(task: dict) -> dict:
    """Run `task` in a fresh interpreter (its peak memory is its own); its JSON answer."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(task)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the child process for {task['kind']} ({task.get('name')}) failed:\n"
            + done.stdout[-2000:]
            + done.stderr[-3000:]
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run_child(task: dict) -> dict:
    """In the child: build the state, then time one save, load or training run, with the
    peak resident memory above the resident memory just before it."""
    args = argparse.Namespace(**task["config"])
    lm.deterministic(0)
    if task["kind"] == "train":
        if task["name"].startswith("ds"):
            return _train_run_deepspeed(args, task["name"], task["dir"])
        if task["name"] == "torch_save:sync":
            return _train_run_torch_save(args, task["dir"])
        return _train_run(args, task["name"], task["dir"])
    adapters = task["workload"] == "adapters"
    model, opt = _setup(args, adapters)
    lm.train_step(model, opt, *lm.batch(lm.corpus("grammar", 5_000), 0, 2), 1e-3)
    state = _state(model, opt)
    if task["kind"] == "save":
        backend = B.make(task["name"], task["root"])
        op = lambda: backend.save(state, 0)  # noqa: E731
    else:
        backend = B.make(task["name"], task["root"], ids=task["ids"])
        op = lambda: backend.load(len(task["ids"]) - 1, state)  # noqa: E731
    gc.collect()
    B.reset_peak_rss()
    start = B.rss()
    seconds = B.timed(op)
    peak = B.peak_rss_above(start)
    backend.close()
    return {"seconds": seconds, "rss_start": start, "rss_peak_above_start": peak}


def _memory(args, work, workload, name, root, ids) -> dict:
    """A save into a new store and a load of the last version, each in a fresh process."""
    config = {k: getattr(args, k) for k in CONFIG}
    save = _child(
        {
            "kind": "save",
            "config": config,
            "workload": workload,
            "name": name,
            "root": os.path.join(work, f"mem-{workload}-{name}"),
        }
    )
    load = _child(
        {
            "kind": "load",
            "config": config,
            "workload": workload,
            "name": name,
            "root": root,
            "ids": ids,
        }
    )
    return {
        "rss_save_bytes": save["rss_peak_above_start"],
        "rss_load_bytes": load["rss_peak_above_start"],
        "save_s_new_process": save["seconds"],
        "load_s_new_process": load["seconds"],
    }


def _template(args, adapters: bool) -> dict:
    """A state dict of the workload's structure to load into (its moments exist)."""
    model, opt = _setup(args, adapters)
    opt.zero_grad()
    lm.train_step(model, opt, *lm.batch(lm.corpus("grammar", 5_000), 0, 2), 0.0)
    return _state(model, opt)


def storage(args, work: str, adapters: bool) -> dict:
    states, total, trainable = _versions(args, adapters)
    template = _template(args, adapters)
    out = {
        "state_bytes": total,
        "trainable_bytes": trainable,
        "versions": len(states),
        "steps_between": args.k,
        "backends": {},
    }
    workload = "adapters" if adapters else "full"
    for name in args.backends:
        root = os.path.join(work, f"{workload}-{name}")
        r = _one_backend(name, states, template, root, args.repeats)
        r["per_version_vs_state"] = r["bytes_per_version"] / total
        r["per_version_vs_trainable"] = r["bytes_per_version"] / trainable
        if name in args.memory_backends:
            r.update(_memory(args, work, workload, name, root, r["ids"]))
        out["backends"][name] = r
        shutil.rmtree(root, ignore_errors=True)
    return out


def durability(args, work: str) -> dict:
    """The ``full`` workload's versions saved by our writer and DCP's, each with and
    without fsync, interleaved (version by version, in rotated order)."""
    states, total, _ = _versions(args, adapters=False)
    names = [n for pair in DURABILITY.values() for n in pair]
    roots = {n: os.path.join(work, f"durability-{n}") for n in names}
    backends = {n: B.make(n, roots[n]) for n in names}
    save_s: dict[str, list[float]] = {n: [] for n in names}
    load_before = os.getloadavg()
    for i, sd in enumerate(states):
        for n in names[i % len(names) :] + names[: i % len(names)]:
            gc.collect()
            save_s[n].append(B.timed(backends[n].save, sd, i))
    out: dict = {
        "state_bytes": total,
        "versions": len(states),
        "steps_between": args.k,
        "order": "interleaved: every version saved by all four, in rotated order",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "backends": {},
        "pairs": {},
    }
    for n, backend in backends.items():
        target = _template(args, adapters=False)
        backend.load(len(states) - 1, target)
        backend.close()
        out["backends"][n] = {
            "fsync": backend.fsync,
            "setup": SETUPS[n],
            "save_s": save_s[n],
            "save_s_cold": save_s[n][0],
            "save_s_warm": statistics.median(save_s[n][1:]),
            "bytes": disk_bytes(roots[n]),
            "restored_equal": _equal(target, states[-1]),
        }
        shutil.rmtree(roots[n], ignore_errors=True)
    for pair, (ours, peer) in DURABILITY.items():
        out["pairs"][pair] = {
            "ours": ours,
            "peer": peer,
            "fsync": pair == "fsync",
            "warm_ratio": out["backends"][ours]["save_s_warm"]
            / out["backends"][peer]["save_s_warm"],
        }
    return out


def _timed_loop(args, step, checkpoint, finish=None) -> dict:
    """Run `step(s)` for ``s < args.train_steps``, `checkpoint(s + 1)` after every
    `args.k` steps, then `finish()`: seconds, CPU seconds, the seconds spent in
    `checkpoint` and `finish` (``blocked``), and the peak resident memory above
    the resident memory at the start of the loop."""
    gc.collect()
    B.reset_peak_rss()
    start = B.rss()
    blocked = 0.0  # seconds the loop spent in checkpoint calls (waits for the previous included)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for s in range(args.train_steps):
        step(s)
        if checkpoint is not None and (s + 1) % args.k == 0:
            b0 = time.perf_counter()
            checkpoint(s + 1)
            blocked += time.perf_counter() - b0
    if finish is not None:
        b0 = time.perf_counter()
        finish()
        blocked += time.perf_counter() - b0
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "blocked_seconds": blocked,
        "rss_start": start,
        "rss_peak_above_start": B.peak_rss_above(start),
    }


def _train_run(args, mode: str, work: str) -> dict:
    """`args.train_steps` steps with a checkpoint every `args.k` (`mode`) or none: seconds,
    and the peak resident memory above the resident memory at the start of the loop."""
    data = lm.corpus("grammar", 50_000)
    model, opt = _setup(args, adapters=False)
    root = tempfile.mkdtemp(dir=work)
    kind, _, how = mode.partition(":")
    backend = B.make(kind, root) if kind != "none" else None
    pending = []

    def step(s):
        lm.train_step(model, opt, *lm.batch(data, s, args.batch), 1e-3)

    def checkpoint(s):
        if pending:
            pending.pop().result()
        if how == "async":
            pending.append(dcp.async_save(_state(model, opt), storage_writer=backend.writer(s)))
        else:
            dcp.save(_state(model, opt), storage_writer=backend.writer(s))

    def finish():
        if pending:
            pending.pop().result()

    out = _timed_loop(args, step, *((checkpoint, finish) if backend is not None else (None, None)))
    if backend is not None:
        backend.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def _train_run_torch_save(args, work: str) -> dict:
    """`_train_run` with ``torch.save`` of the model's and optimizer's state dicts
    into a new file every `args.k` steps, as a plain PyTorch loop does."""
    data = lm.corpus("grammar", 50_000)
    model, opt = _setup(args, adapters=False)
    root = tempfile.mkdtemp(dir=work)

    def step(s):
        lm.train_step(model, opt, *lm.batch(data, s, args.batch), 1e-3)

    def checkpoint(s):
        torch.save(
            {"model": model.state_dict(), "optim": opt.state_dict()},
            os.path.join(root, f"step{s}.pt"),
        )

    out = _timed_loop(args, step, checkpoint)
    shutil.rmtree(root, ignore_errors=True)
    return out


def _train_run_deepspeed(args, mode: str, work: str) -> dict:
    """`_train_run` through a DeepSpeed engine (ZeRO stage 0, the same AdamW as
    a client optimizer, one process on gloo): ``ds:none`` without checkpoints,
    ``ds_default:sync`` with ``engine.save_checkpoint`` and DeepSpeed's default
    (``torch.save``) checkpoint engine, ``ds_vlcc:sync`` the same call with
    :class:`~vlcc_adjoint.torch.VlccCheckpointEngine` attached (its deferred
    copies and background writes; the last one waited for before the clock
    stops)."""
    import deepspeed
    import torch.nn.functional as F

    from vlcc_adjoint.torch import VlccCheckpointEngine

    port = 29500 + os.getpid() % 2000
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # one process: not needed
    data = lm.corpus("grammar", 50_000)
    model, opt = _setup(args, adapters=False)
    config = {"train_batch_size": args.batch, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    if mode == "ds_vlcc:sync":
        VlccCheckpointEngine.attach(engine)
    root = tempfile.mkdtemp(dir=work)

    def step(s):
        x, y = lm.batch(data, s, args.batch)
        loss = F.cross_entropy(engine(x).flatten(0, 1), y.flatten())
        engine.backward(loss)
        engine.step()

    def checkpoint(s):
        engine.save_checkpoint(root, tag=f"step{s}")

    def finish():
        engine.checkpoint_engine.wait()

    out = _timed_loop(
        args,
        step,
        None if mode == "ds:none" else checkpoint,
        finish if mode == "ds_vlcc:sync" else None,
    )
    engine.destroy()
    shutil.rmtree(root, ignore_errors=True)
    return out


def _deepspeed_installed() -> bool:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return False
    return True


#: each mode's run without checkpoints (its slowdown's denominator)
def _baseline(mode: str) -> str:
    return "ds:none" if mode.startswith("ds") else "none"


def training(args, work: str) -> dict:
    """Each run in a fresh process (memory peaks are per run), modes interleaved."""
    modes = ["vlcc:sync", "vlcc:async", "dcp_fs:sync", "dcp_fs:async", "torch_save:sync"]
    baselines = ["none"]
    deepspeed = _deepspeed_installed()
    if deepspeed:
        modes += ["ds_default:sync", "ds_vlcc:sync"]
        baselines.append("ds:none")
    runs: dict[str, list[dict]] = {m: [] for m in [*baselines, *modes]}
    config = {k: getattr(args, k) for k in CONFIG}
    load_before = os.getloadavg()
    order = [*baselines, *modes]
    for r in range(args.train_repeats):
        for mode in order[r % len(order) :] + order[: r % len(order)]:
            runs[mode].append(
                _child({"kind": "train", "config": config, "name": mode, "dir": work})
            )
    none = [x["seconds"] for x in runs["none"]]
    out = {
        "steps": args.train_steps,
        "k": args.k,
        "repeats": args.train_repeats,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "seconds_none": none,
        "step_s_none": statistics.median(none) / args.train_steps,
        "rss_none_bytes": statistics.median(x["rss_peak_above_start"] for x in runs["none"]),
        "deepspeed": deepspeed,
        "modes": {},
    }
    out["cpu_seconds_none"] = [x["cpu_seconds"] for x in runs["none"]]
    if deepspeed:
        out["seconds_ds_none"] = [x["seconds"] for x in runs["ds:none"]]
        out["cpu_seconds_ds_none"] = [x["cpu_seconds"] for x in runs["ds:none"]]
        out["step_s_ds_none"] = statistics.median(out["seconds_ds_none"]) / args.train_steps
    for m in modes:
        base = runs[_baseline(m)]
        seconds = [x["seconds"] for x in runs[m]]
        ratios = [t / b["seconds"] - 1.0 for t, b in zip(seconds, base)]
        blocked = [x["blocked_seconds"] / (x["seconds"] - x["blocked_seconds"]) for x in runs[m]]
        cpu = [x["cpu_seconds"] / b["cpu_seconds"] - 1.0 for x, b in zip(runs[m], base)]
        peaks = [x["rss_peak_above_start"] for x in runs[m]]
        out["modes"][m.replace(":", "_")] = {
            "seconds": seconds,
            "slowdown": ratios,
            "slowdown_median": statistics.median(ratios),
            "blocked_seconds": [x["blocked_seconds"] for x in runs[m]],
            "blocked_fraction": blocked,
            "blocked_fraction_median": statistics.median(blocked),
            "cpu_seconds": [x["cpu_seconds"] for x in runs[m]],
            "cpu_overhead": cpu,
            "cpu_overhead_median": statistics.median(cpu),
            "rss_peak_bytes": peaks,
            "rss_peak_median_bytes": statistics.median(peaks),
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny size for CI (seconds)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8, help="adapter rank")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--versions", type=int, default=8)
    parser.add_argument("--k", type=int, default=10, help="training steps between versions")
    parser.add_argument("--repeats", type=int, default=3, help="warm loads")
    parser.add_argument("--train-steps", type=int, default=40)
    parser.add_argument("--train-repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="*", default=BACKENDS, choices=BACKENDS)
    parser.add_argument(
        "--memory-backends",
        nargs="*",
        default=None,
        choices=BACKENDS,
        help="backends whose save/load memory is measured in fresh processes "
        "(default: all; --quick: vlcc and dcp_fs)",
    )
    parser.add_argument("--no-training", action="store_true", help="skip the slowdown runs")
    parser.add_argument(
        "--only-durability",
        action="store_true",
        help="measure only the 'durability' section (warm saves, fsync against fsync and "
        "none against none) and put it into the results file already in --out, keeping "
        "its other sections and claims (a new file when there is none)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help="where the stores go (default: temp)")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    parser.add_argument(
        "--update-results", action="store_true", help="write benchmarks/results/bench_dcp.json"
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_run_child(json.loads(args.child))))
        return 0
    if args.memory_backends is None:
        args.memory_backends = ["vlcc", "dcp_fs"] if args.quick else list(args.backends)
    if args.quick:
        args.d_model, args.layers, args.rank, args.batch = 64, 2, 4, 4
        args.versions, args.k, args.repeats = 3, 1, 1
        args.train_steps, args.train_repeats = 4, 1
    if args.update_results:
        args.out = os.path.join(HERE, "results")
    lm.deterministic(0)
    work = tempfile.mkdtemp(prefix="vlcc-dcp-", dir=args.dir)
    t_start = time.time()
    path = os.path.join(args.out, "bench_dcp.json")
    records = claims.tracked(Path(args.out))  # the claims of the file this run rewrites
    try:
        if args.only_durability:
            res = {"durability": durability(args, work)}
        else:
            res = {
                "full": storage(args, work, adapters=False),
                "adapters": storage(args, work, adapters=True),
                "durability": durability(args, work),
            }
            if not args.no_training:
                res["training"] = training(args, work)
                res["training"]["state_bytes"] = res["full"]["state_bytes"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts = _facts(args, argv, t_start)
    if args.only_durability:
        res["durability"].update(facts)  # this section's own run
        result = _read_results(path) or {"benchmark": "bench_dcp", **facts}
        result.update(res)
    else:
        result = {"benchmark": "bench_dcp", **facts, **res}
        ours = res["adapters"]["backends"].get("vlcc")
        if ours is not None:
            result["targets"] = {
                "adapters_per_version_le_1.1_trainable": ours["per_version_vs_trainable"] <= 1.1
            }
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    claims.attach(Path(args.out), ["bench_dcp.json"], records)
    _print(result)
    print(f"\nwrote {path}")
    return 0


def _facts(args, argv, t_start: float) -> dict:
    """What a results file records of its run: command, size, wall time, machine."""
    import icechunk

    return {
        "quick": args.quick,
        "command": "python benchmarks/bench_dcp.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {k: getattr(args, k) for k in CONFIG},
        "wall_s": time.time() - t_start,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "icechunk": icechunk.__version__,
            "threads": torch.get_num_threads(),
            "load_avg": os.getloadavg(),
        },
    }


def _read_results(path: str) -> dict | None:
    """The results file at `path` (a regular file, not a link), or ``None``."""
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    with open(path) as f:
        found = json.load(f)
    return found if isinstance(found, dict) else None


def _mib(x) -> str:
    return "-" if x is None else f"{x / (1 << 20):.1f}"


def _print(result: dict) -> None:
    mib = float(1 << 20)
    for w in ("full", "adapters"):
        r = result.get(w)
        if r is None:
            continue
        print(
            f"\n{w}: state {r['state_bytes'] / mib:.2f} MiB, trainable "
            f"{r['trainable_bytes'] / mib:.3f} MiB, {r['versions']} versions"
        )
        print(
            "  backend            save cold/warm ms   load cold/warm ms   MiB first  "
            "per version (x state, x trainable)   RSS save/load MiB  equal"
        )
        for name, b in r["backends"].items():
            print(
                f"  {name:17s} {b['save_s_cold'] * 1e3:8.1f} {b['save_s_warm'] * 1e3:8.1f}  "
                f"{b['load_s_cold'] * 1e3:8.1f} {b['load_s_warm'] * 1e3:8.1f}  "
                f"{b['bytes_first'] / mib:9.2f}  {b['bytes_per_version'] / mib:8.3f} "
                f"({b['per_version_vs_state']:.3f}x, {b['per_version_vs_trainable']:.3f}x)  "
                f"{_mib(b.get('rss_save_bytes')):>8s} {_mib(b.get('rss_load_bytes')):>6s}  "
                f"{b['restored_equal']}"
            )
    d = result.get("durability")
    if d:
        print(
            f"\ndurability: warm saves of {d['state_bytes'] / mib:.2f} MiB, {d['versions']} "
            f"versions interleaved; load {d['load_before'][0]:.1f} -> {d['load_after'][0]:.1f}"
        )
        for pair in d["pairs"].values():
            ours, peer = d["backends"][pair["ours"]], d["backends"][pair["peer"]]
            print(
                f"  {'fsync' if pair['fsync'] else 'no fsync':9s} {pair['ours']:13s} "
                f"{ours['save_s_warm'] * 1e3:8.1f} ms  {pair['peer']:14s} "
                f"{peer['save_s_warm'] * 1e3:8.1f} ms  ours/DCP {pair['warm_ratio']:.3f}x  "
                f"equal {ours['restored_equal'] and peer['restored_equal']}"
            )
    t = result.get("training")
    if t:
        print(
            f"\ntraining: {t['steps']} steps, a checkpoint every {t['k']}; step "
            f"{t['step_s_none'] * 1e3:.0f} ms without; load {t['load_before'][0]:.1f} -> "
            f"{t['load_after'][0]:.1f}; state {t['state_bytes'] / mib:.1f} MiB; peak memory "
            f"above the start without checkpoints {_mib(t['rss_none_bytes'])} MiB"
        )
        for m, v in t["modes"].items():
            print(
                f"  {m:14s} wall slowdown median {v['slowdown_median'] * 100:6.1f}%  "
                f"({', '.join(f'{x * 100:.1f}' for x in v['slowdown'])}); blocked "
                f"{v['blocked_fraction_median'] * 100:.1f}% of the training time; CPU "
                f"+{v['cpu_overhead_median'] * 100:.1f}%; peak memory "
                f"{_mib(v['rss_peak_median_bytes'])} MiB"
            )


if __name__ == "__main__":
    raise SystemExit(main())
