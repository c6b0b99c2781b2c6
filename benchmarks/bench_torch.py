"""Benchmark: vlcc_adjoint.torch against PyTorch's own checkpointing.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_torch.py --quick     # ~3 minutes
    python benchmarks/bench_torch.py             # full: ~10 minutes on 2 shared cores
    python benchmarks/bench_torch.py --part a    # or b

Writes ``DIR/bench_torch.json`` (every repeat, every median, the machine
and its load average before and after; ``--out DIR``, default
``$TMPDIR/vlcc-bench-results/``) and prints two tables.
``torch.set_num_threads(1)`` throughout: the VM has 2 shared cores, one for
the training thread, one for background writers.

(a) Activation memory of a long chain: an ``nn.RNNCell`` (input 32, hidden
128, batch 64, float32: a 32 KiB state) over ``n = 2000`` steps, loss =
sum of the last state, gradient w.r.t. ``h0`` and the cell's parameters.

* ``plain``: autograd keeps every step's tape (``n`` states: the ``tanh``
  output each step saves);
* ``ckpt_seq(s)``: ``torch.utils.checkpoint.checkpoint_sequential`` over
  ``n`` one-step modules in ``s`` segments, ``use_reentrant=False`` (the
  mode PyTorch recommends) and ``=True``; it keeps ``s`` segment inputs and
  one segment's tape, ``s + n/s`` states, never less than ``2 sqrt(n)``;
* ``vlcc(M)``: :func:`vlcc_adjoint.torch.checkpoint_sequence` with the
  ``(block, snapshots)`` of :func:`~vlcc_adjoint.torch.plan_sequence` for
  the same memory ``M = s + n/s`` (Revolve over blocks), and below
  ``checkpoint_sequential``'s floor; ``vlcc default`` is the default
  ``Revolve(n, ceil(sqrt(n)))`` one step at a time.

Time: the CPU time of the (single) computing thread, ``time.thread_time()``,
for one forward + backward, median of interleaved repeats.  CPU time, not
wall time: the VM's two cores are shared with other jobs (load average 4-8
while this was measured), and a thread's CPU time does not count the time
it waits for a core (the wall times are in the JSON, much noisier).
``extra`` = time - plain's time (the price of recomputation); ``ratio`` =
checkpoint_sequential's extra / ours at the same memory.  Memory: the peak
bytes of tensor storage alive at once during one forward + backward (every
aten op's outputs, tracked by a ``TorchDispatchMode`` until their storage is
freed; :class:`LiveBytes`), in MiB and in states; measured in a separate,
untimed pass.
``evals``: step evaluations beyond plain's ``n`` (counted).

(b) Training-state checkpoints: an MLP (``--layers`` x ``--width``^2
float32 weights, 128 MiB by default) with AdamW (2 more copies: 384 MiB of
state), trained on random batches.  Every round, each method runs
``--steps`` training steps, checkpoints, and runs one more step; the
*blocked time* is the time the training loop spends in the checkpoint call
plus any wait before the next optimizer step (async methods must not let the
step overwrite weights they are still copying).  Between methods the
background writes finish untimed (``write s``: checkpoint call to data in
the page cache).  Methods:

* ``torch.save``: ``torch.save({"model", "optim"}, path)``;
* ``dcp.save``, ``dcp.async_save``: ``torch.distributed.checkpoint`` (one
  process, gloo group) through ``FileSystemWriter(path, sync_files=False)``:
  the writer's default fsyncs every file, which none of the other methods
  does, so it is turned off here to compare like with like; the async one
  stages to CPU, writes in a thread, and is waited for before the next
  checkpoint;
* ``vlcc copy``: :class:`~vlcc_adjoint.torch.VlccCheckpointEngine` with
  ``defer=False``: ``save`` copies the state into reused buffers, a History
  writer thread hashes and writes it; ``commit`` (called before the next
  ``optimizer.step``, as DeepSpeed does) has nothing left to wait for;
  ``latest`` follows once the version is on disk;
* ``vlcc deferred``: ``defer=True`` (what ``attach`` gives under
  DeepSpeed): parameters and AdamW state are copied by a capture thread
  during the next forward/backward pass; the optimizer step waits for what
  is left of that copy;
* ``vlcc deferred +disk``: the same with ``wait_on_commit="written"``: the
  optimizer step also waits until the version is on disk.

Files go to ``--dir`` (default: a temporary directory under /tmp), no
fsync for any method (page cache, as ``torch.save`` does by default; DCP's
writer is told so).  The results file records it under
``meta.durability``.  (Results written before this note ran DCP's writer
with its default, an fsync of every file.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from vlcc_adjoint.torch import VlccCheckpointEngine, checkpoint_sequence, plan_sequence  # noqa: E402

# -- (a) the RNN chain ----------------------------------------------------------------------

RNN = dict(batch=64, hidden=128, inputs=32)


def rnn_problem(n, seed=0):
    torch.manual_seed(seed)
    cell = torch.nn.RNNCell(RNN["inputs"], RNN["hidden"])
    xs = torch.randn(n, RNN["batch"], RNN["inputs"])
    h0 = torch.zeros(RNN["batch"], RNN["hidden"], requires_grad=True)
    return cell, xs, h0


def make_runner(config, n, cell, xs, h0, counter=None):
    """A function running one forward + backward of `config`."""
    kind = config["kind"]
    if counter is not None:
        base = cell

        def counted(x, h):
            counter[0] += 1
            return base(x, h)

        stepf = counted
    else:
        stepf = cell
    if kind == "plain":

        def run():
            h = h0
            for i in range(n):
                h = stepf(xs[i], h)
            h.sum().backward()

        return run
    if kind.startswith("ckpt_seq"):
        from torch.utils.checkpoint import checkpoint_sequential

        reentrant = kind.endswith("reentrant")

        class Step(torch.nn.Module):
            def __init__(self, i):
                super().__init__()
                self.i = i

            def forward(self, h):
                return stepf(xs[self.i], h)

        seq = torch.nn.Sequential(*[Step(i) for i in range(n)])

        def run():
            h = checkpoint_sequential(seq, config["segments"], h0, use_reentrant=reentrant)
            h.sum().backward()

        return run
    if kind == "vlcc":

        def run():
            h = checkpoint_sequence(
                stepf,
                h0,
                n,
                inputs=xs,
                block=config["block"],
                snapshots=config["snapshots"],
                params=list(cell.parameters()),
            )
            h.sum().backward()

        return run
    raise ValueError(kind)


def rnn_configs(n, quick):
    floor = math.isqrt(n)
    segments = sorted(
        {max(2, floor), max(2, floor // 2), 10, 4} if not quick else {max(2, floor), 4}
    )
    configs = [{"name": "plain", "kind": "plain", "memory": n}]
    for s in segments:
        mem = s + n / s
        configs.append(
            {"name": f"ckpt_seq s={s}", "kind": "ckpt_seq", "segments": s, "memory": mem}
        )
        configs.append(
            {
                "name": f"ckpt_seq s={s} reentrant",
                "kind": "ckpt_seq_reentrant",
                "segments": s,
                "memory": mem,
            }
        )
        p = plan_sequence(n, mem)
        configs.append(
            {
                "name": f"vlcc M={mem:.0f}",
                "kind": "vlcc",
                "block": p.block,
                "snapshots": p.snapshots,
                "memory": p.memory,
                "vs": s,
            }
        )
    c = math.isqrt(n - 1) + 1
    configs.append(
        {"name": "vlcc default", "kind": "vlcc", "block": 1, "snapshots": c, "memory": c + 1}
    )
    for mem in [10, 24] if not quick else [12]:
        p = plan_sequence(n, mem)
        configs.append(
            {
                "name": f"vlcc M={mem} (below floor)",
                "kind": "vlcc",
                "block": p.block,
                "snapshots": p.snapshots,
                "memory": p.memory,
            }
        )
    return configs


class LiveBytes:
    """Peak bytes of tensor storage alive at once, allocated inside the context.

    A ``TorchDispatchMode`` sees the output of every aten op (forward, no-grad
    recomputation and the autograd engine's backward kernels alike, on the
    calling thread); each new storage is counted until a ``weakref.finalize``
    on it fires (PyTorch keeps a storage's Python object alive exactly as
    long as the storage).  Tensors that existed before (inputs, parameters)
    are not counted; views and in-place results are counted once.
    """

    def __init__(self, existing=()):
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                owner._see(out)
                return out

        self.mode = Mode()
        self.live = self.peak = 0
        # Storages alive before (inputs, parameters): views of them are not new.
        self.seen = {t.untyped_storage().data_ptr() for t in existing}

    def _drop(self, key, n):
        self.live -= n
        self.seen.discard(key)

    def _see(self, out):
        import weakref

        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                key = st.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    n = st.nbytes()
                    self.live += n
                    weakref.finalize(st, self._drop, key, n)
                    if self.live > self.peak:
                        self.peak = self.live

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def measure_memory(n, configs):
    """Peak live tensor bytes of one forward + backward of each config."""
    out = {}
    for cfg in configs:
        cell, xs, h0 = rnn_problem(n)
        run = make_runner(cfg, n, cell, xs, h0)
        with LiveBytes([xs, h0, *cell.parameters()]) as mem:
            run()
        out[cfg["name"]] = mem.peak
    return out


def part_a(n, repeats, quick):
    configs = rnn_configs(n, quick)
    cell, xs, h0 = rnn_problem(n)
    evals = {}
    for cfg in configs:  # count evaluations (and check gradients against plain)
        counter = [0]
        run = make_runner(cfg, n, cell, xs, h0, counter)
        cell.zero_grad()
        h0.grad = None
        run()
        evals[cfg["name"]] = counter[0] - n
        grads = [h0.grad.clone()] + [p.grad.clone() for p in cell.parameters()]
        if cfg["kind"] == "plain":
            ref = grads
        else:
            err = max(
                float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(grads, ref)
            )
            cfg["max_rel_err"] = err
    times = {c["name"]: [] for c in configs}
    walls = {c["name"]: [] for c in configs}
    for _ in range(repeats):  # interleaved
        for cfg in configs:
            run = make_runner(cfg, n, cell, xs, h0)
            cell.zero_grad()
            h0.grad = None
            w0, t0 = time.perf_counter(), time.thread_time()
            run()
            times[cfg["name"]].append(time.thread_time() - t0)
            walls[cfg["name"]].append(time.perf_counter() - w0)
    memory = measure_memory(n, configs)
    state_bytes = RNN["batch"] * RNN["hidden"] * 4
    plain_t = statistics.median(times["plain"])
    rows = []
    for cfg in configs:
        t = statistics.median(times[cfg["name"]])
        rows.append(
            dict(
                cfg,
                seconds=t,
                repeats=times[cfg["name"]],
                extra=t - plain_t,
                wall=statistics.median(walls[cfg["name"]]),
                wall_repeats=walls[cfg["name"]],
                evals=evals[cfg["name"]],
                peak_rss=memory[cfg["name"]],
                peak_states=memory[cfg["name"]] / state_bytes,
            )
        )
    by = {r["name"]: r for r in rows}
    for r in rows:
        if r["kind"] == "vlcc" and "vs" in r:
            for mode in ("", " reentrant"):
                cs = by[f"ckpt_seq s={r['vs']}{mode}"]
                key = "ratio_vs_reentrant" if mode else "ratio_vs_nonreentrant"
                r[key] = cs["extra"] / r["extra"] if r["extra"] > 0 else float("inf")
    print(
        f"\n(a) RNNCell, n={n}, batch {RNN['batch']}, hidden {RNN['hidden']}: one state = "
        f"{state_bytes >> 10} KiB; thread CPU seconds, medians of {repeats} interleaved repeats"
    )
    print(
        f"{'config':30s} {'blk':>4s} {'snap':>5s} {'M(st)':>6s} {'peakMiB':>8s} {'peak st':>8s} "
        f"{'evals':>6s} {'cpu s':>7s} {'extra s':>8s} {'ratio':>11s}"
    )
    for r in rows:
        ratio = ""
        if "ratio_vs_nonreentrant" in r:
            ratio = f"{r['ratio_vs_nonreentrant']:.2f}/{r['ratio_vs_reentrant']:.2f}"
        print(
            f"{r['name']:30s} {r.get('block', ''):>4} {r.get('snapshots', ''):>5} "
            f"{r['memory']:6.0f} {r['peak_rss'] / 2**20:8.1f} {r['peak_states']:8.0f} "
            f"{r['evals']:6d} {r['seconds']:7.2f} {r['extra']:8.2f} {ratio:>11s}"
        )
    print(
        "ratio: checkpoint_sequential's extra time / ours at the same memory "
        "(use_reentrant=False / True)"
    )
    return {"n": n, "rnn": RNN, "state_bytes": state_bytes, "rows": rows}


# -- (b) training-state checkpoints -------------------------------------------------------


def make_model(layers, width, seed=0):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def train_step(model, opt, batch, width):
    x = torch.randn(batch, width)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def _dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class Method:
    name = ""

    def setup(self, model, opt, root):
        pass

    def checkpoint(self, model, opt, i):
        """Returns the seconds spent in the call."""
        raise NotImplementedError

    def before_step(self):
        """Seconds waited before the next optimizer step."""
        return 0.0

    def finish(self):
        """Untimed: wait for background writes; returns seconds."""
        return 0.0

    def close(self):
        pass


class TorchSave(Method):
    name = "torch.save"

    def setup(self, model, opt, root):
        self.path = os.path.join(root, "torch_save.pt")

    def checkpoint(self, model, opt, i):
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, self.path)
        return time.perf_counter() - t0


class DCP(Method):
    def __init__(self, asynchronous):
        self.asynchronous = asynchronous
        self.name = "dcp.async_save" if asynchronous else "dcp.save"
        self.future = None

    def setup(self, model, opt, root):
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29533")
            dist.init_process_group("gloo", rank=0, world_size=1)
        self.dcp, self.get_state_dict = dcp, get_state_dict
        self.writer = dcp.FileSystemWriter  # sync_files=False: no fsync, as every other method
        self.root = root
        self.available = not self.asynchronous or hasattr(dcp, "async_save")

    def checkpoint(self, model, opt, i):
        t0 = time.perf_counter()
        if self.future is not None:  # the previous async save must be done
            self.future.result()
            self.future = None
        msd, osd = self.get_state_dict(model, opt)
        path = os.path.join(self.root, f"{self.name}-{i % 2}")
        writer = self.writer(path, sync_files=False)
        if self.asynchronous:
            self.future = self.dcp.async_save(
                {"model": msd, "optim": osd}, checkpoint_id=path, storage_writer=writer
            )
        else:
            self.dcp.save({"model": msd, "optim": osd}, checkpoint_id=path, storage_writer=writer)
        return time.perf_counter() - t0

    def finish(self):
        t0 = time.perf_counter()
        if self.future is not None:
            self.future.result()
            self.future = None
        return time.perf_counter() - t0


class Vlcc(Method):
    def __init__(self, defer, wait_on_commit="captured"):
        self.defer = defer
        self.wait_on_commit = wait_on_commit
        self.name = ("vlcc deferred" if defer else "vlcc copy") + (
            " +disk" if wait_on_commit == "written" else ""
        )

    def setup(self, model, opt, root):
        self.root = os.path.join(root, self.name.replace(" ", "_").replace("+", ""))
        kw = dict(model=model, optimizer=opt) if self.defer else {}
        self.engine = VlccCheckpointEngine(
            os.path.join(self.root, "history"),
            defer=self.defer,
            wait_on_commit=self.wait_on_commit,
            **kw,
        )
        self.opt = opt

    def checkpoint(self, model, opt, i):
        class Info:
            tag, save_dir, save_latest = f"global_step{i}", self.root, True

        t0 = time.perf_counter()
        self.engine.create(Info)
        os.makedirs(os.path.join(self.root, Info.tag), exist_ok=True)
        self.engine.save(
            {"module": model.state_dict(), "optimizer": opt.state_dict()},
            os.path.join(self.root, Info.tag, "mp_rank_00_model_states.pt"),
        )
        self.info = Info
        return time.perf_counter() - t0

    def before_step(self):
        t0 = time.perf_counter()
        self.engine.commit(self.info)  # what DeepSpeed does before the optimizer step
        return time.perf_counter() - t0

    def finish(self):
        t0 = time.perf_counter()
        self.engine.wait()
        h = self.engine.history()
        from vlcc_adjoint.lineage import KeepPolicy

        h.gc(KeepPolicy(last=1))  # keep the disk bounded (untimed)
        return time.perf_counter() - t0

    def close(self):
        self.engine.close()


def part_b(layers, width, batch, steps, rounds, root):
    model, opt = make_model(layers, width)
    train_step(model, opt, batch, width)  # AdamW state exists
    state_bytes = sum(p.numel() * 4 for p in model.parameters()) * 3
    methods = [TorchSave(), DCP(False), DCP(True), Vlcc(False), Vlcc(True), Vlcc(True, "written")]
    for m in methods:
        m.setup(model, opt, root)
    methods = [m for m in methods if getattr(m, "available", True)]
    # Warm up every method once (page faults, imports, thread start).
    for m in methods:
        m.checkpoint(model, opt, 0)
        m.before_step()
        m.finish()
    t0 = time.perf_counter()
    train_step(model, opt, batch, width)
    step_time = time.perf_counter() - t0
    res = {m.name: {"blocked": [], "call": [], "wait": [], "write": []} for m in methods}
    k = 1
    for _ in range(rounds):
        for m in methods:  # interleaved
            for _ in range(steps):
                train_step(model, opt, batch, width)
            call = m.checkpoint(model, opt, k)
            # The next iteration: forward and backward run, then the optimizer
            # step, which an asynchronous method may have to hold.
            x = torch.randn(batch, width)
            model(x).square().mean().backward()
            wait = m.before_step()
            opt.step()
            opt.zero_grad(set_to_none=False)
            write = m.finish()
            r = res[m.name]
            r["call"].append(call)
            r["wait"].append(wait)
            r["blocked"].append(call + wait)
            r["write"].append(call + wait + write)
            k += 1
    for m in methods:
        m.close()
    rows = []
    base = statistics.median(res["torch.save"]["blocked"])
    print(
        f"\n(b) MLP {layers} x {width}^2 + AdamW: {state_bytes / 2**20:.0f} MiB of state; "
        f"training step {step_time:.2f} s (batch {batch}); medians of {rounds} interleaved rounds"
    )
    print(
        f"{'method':16s} {'blocked s':>10s} {'in call':>8s} {'wait':>7s} {'write s':>8s} "
        f"{'/torch.save':>12s}"
    )
    for m in methods:
        r = res[m.name]
        row = {"method": m.name, **{k: statistics.median(v) for k, v in r.items()}, "repeats": r}
        row["vs_torch_save"] = row["blocked"] / base
        rows.append(row)
        print(
            f"{m.name:16s} {row['blocked']:10.3f} {row['call']:8.3f} {row['wait']:7.3f} "
            f"{row['write']:8.3f} {row['vs_torch_save']:12.3f}"
        )
    return {
        "layers": layers,
        "width": width,
        "batch": batch,
        "steps_between": steps,
        "state_bytes": state_bytes,
        "train_step_seconds": step_time,
        "rows": rows,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=["a", "b", "ab"], default="ab")
    ap.add_argument("--steps", type=int, default=None, help="(a) chain length")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--dir", default=None)
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    args = ap.parse_args(argv)
    n = args.steps or (500 if args.quick else 2000)
    repeats = args.repeats or (3 if args.quick else 7)
    meta = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "loadavg_before": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "durability": "no fsync for any method: torch.save and ours write to the page cache, "
        "DCP's FileSystemWriter runs with sync_files=False",
    }
    out = {"meta": meta}
    if "a" in args.part:
        out["a"] = part_a(n, repeats, args.quick)
    if "b" in args.part:
        width = args.width if not args.quick else args.width // 2
        root = tempfile.mkdtemp(prefix="bench-torch-", dir=args.dir)
        try:
            out["b"] = part_b(args.layers, width, 8, 2, 3 if args.quick else 5, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    meta["loadavg_after"] = os.getloadavg()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "bench_torch.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
