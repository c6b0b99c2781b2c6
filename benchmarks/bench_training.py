"""Benchmark: the cost of one training checkpoint, per backend, in CPU seconds and blocked seconds.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_training.py --quick            # CI size, about a minute
    python benchmarks/bench_training.py --update-results   # benchmarks/results/bench_training.json

Wall-clock slowdowns of a training loop on a shared two-core machine spread
by tens of percent and cannot rank backends.  Measured here instead, for
every checkpoint, in one process (one thread for torch's ops), the backends
interleaved in rotated order, ``--repeats`` times:

* ``cpu_s``: CPU seconds of every thread of the process (``time.process_time``)
  and of its children (``resource.getrusage(RUSAGE_CHILDREN)``) from the call
  that starts the checkpoint until its bytes are written (background writes
  included: the async backends are waited for before the clock stops);
* ``blocked_s``: seconds the training loop waits: the save call itself, plus,
  for a decoupled engine, the wait of the commit before the next optimizer
  step (``VlccCheckpointEngine.commit``), plus, for ``dcp.async_save``, the
  staging (the call returns after it);
  (here the commit follows the save at once: no forward and backward pass
  overlaps the capture or, with ``"written"``, the write, so this is the
  upper bound of what a training step waits);
* ``bytes``: bytes added to the checkpoint directory (each inode once);
* ``wall_s``: the same interval as ``cpu_s``, in wall-clock seconds (noisy; for
  ``ds_vlcc_overlap`` and ``vlcc_async_overlap`` the sleep included).

Backends (same state: a model's weights and Adam moments, every tensor changed
by a training step between checkpoints): ``ds_default`` (DeepSpeed's
``save_checkpoint`` with its ``torch.save`` engine), ``ds_vlcc`` (the same with
:class:`~vlcc_adjoint.torch.VlccCheckpointEngine` attached; the next step waits
until the live leaves not written yet are written, by the committing thread
alongside the capture thread: no copy), ``ds_vlcc_copy`` (``copy_on_commit=True``:
the next step waits for the leaf being written and a copy of the live leaves not
written yet, which the capture thread writes behind it),
``ds_vlcc_written`` (``wait_on_commit="written"``: the next step waits for the
write, done from the live tensors without a copy), ``ds_vlcc_overlap``
(``ds_vlcc`` with ``--overlap`` seconds between the save and the next step's
commit: the forward and backward passes of a step on an accelerator, during
which the host's cores are free and the capture thread writes from the live
tensors; the sleep counts neither as CPU nor as blocked time), ``torch_save``
(``torch.save`` of the model and optimizer state dicts), ``dcp_save`` and
``dcp_async`` (DCP's ``FileSystemWriter``), ``vlcc_save`` and ``vlcc_async``
(:class:`~vlcc_adjoint.torch.dcp.VlccWriter`), ``vlcc_async_overlap``
(``VlccWriter(background=True)``: ``dcp.async_save`` returns at once, the staging
copy runs during ``--overlap`` seconds of forward and backward passes, and the
loop waits for ``staging_completion`` before the optimizer step).  Durable against durable: no
backend fsyncs (``torch.save``, DCP's writer with ``sync_files=False``, the
History with ``durable=False``).  Reported: per backend the median and the
interquartile spread of each measure, and the ratios of the goals of issue 34
(``ds_vlcc``/``ds_default`` CPU, ``vlcc_async``/``dcp_async`` CPU,
``vlcc_async`` blocked/``torch_save`` blocked), with the load average.
``--backends`` measures a subset (to profile one comparison; the results file
is written by a run of all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

BACKENDS = [
    "ds_default",
    "ds_vlcc",
    "ds_vlcc_written",
    "ds_vlcc_copy",
    "ds_vlcc_overlap",
    "torch_save",
    "dcp_save",
    "dcp_async",
    "vlcc_save",
    "vlcc_async",
    "vlcc_async_overlap",
]


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _disk_bytes(root: str) -> int:
    seen, total = set(), 0
    for d, _, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def _model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods)


class _Run:
    """One backend's state: a model, its optimizer, a DeepSpeed engine where needed."""

    def __init__(self, name: str, args, root: str):
        from vlcc_adjoint.torch import VlccCheckpointEngine
        from vlcc_adjoint.torch.dcp import VlccWriter

        self.name, self.root, self.k = name, os.path.join(root, name), 0
        os.makedirs(self.root)
        model = _model(args.width, args.layers)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.ds = None
        if name.startswith("ds_"):
            import deepspeed

            cfg = {"train_batch_size": 8, "zero_optimization": {"stage": args.zero}}
            self.ds, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
            self.vlcc = None
            if name != "ds_default":
                wait = "written" if name == "ds_vlcc_written" else "captured"
                self.vlcc = VlccCheckpointEngine.attach(
                    self.ds, wait_on_commit=wait, copy_on_commit=name == "ds_vlcc_copy"
                )
        self.model, self.opt = model, opt
        self.writer = None
        if name.startswith("vlcc"):
            background = name == "vlcc_async_overlap"
            self.writer = VlccWriter(os.path.join(self.root, "h"), background=background)
        self.future = None
        self.width = args.width
        self.overlap = args.overlap
        self.step()

    def step(self) -> None:
        x = torch.randn(8, self.width)
        if self.ds is not None:
            loss = self.ds(x).square().mean()
            self.ds.backward(loss)
            self.ds.step()
        else:
            loss = self.model(x).square().mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def checkpoint(self) -> tuple[float, float]:
        """Save one checkpoint; (blocked seconds, seconds until written)."""
        from torch.distributed.checkpoint import FileSystemWriter

        self.k += 1
        n, t0 = self.name, time.perf_counter()
        if n.startswith("ds_"):
            self.ds.save_checkpoint(self.root, tag=f"t{self.k}")
            slept = 0.0
            if n == "ds_vlcc_overlap":  # the next step's forward and backward passes
                s0 = time.perf_counter()
                time.sleep(self.overlap)
                slept = time.perf_counter() - s0
            if self.vlcc is not None:
                self.vlcc.commit(self.vlcc.get_commit_info())  # what the next step waits for
            blocked = time.perf_counter() - t0 - slept
            if self.vlcc is not None:
                self.vlcc.wait()
        elif n == "torch_save":
            torch.save(self.state(), os.path.join(self.root, f"c{self.k}.pt"))
            blocked = time.perf_counter() - t0
        elif n in ("dcp_save", "dcp_async"):
            w = FileSystemWriter(os.path.join(self.root, f"c{self.k}"), sync_files=False)
            if n == "dcp_save":
                dcp.save(self.state(), storage_writer=w)
                blocked = time.perf_counter() - t0
            else:
                fut = dcp.async_save(self.state(), storage_writer=w)
                blocked = time.perf_counter() - t0
                fut.result()
        else:
            if n == "vlcc_save":
                dcp.save(self.state(), storage_writer=self.writer)
                blocked = time.perf_counter() - t0
            elif n == "vlcc_async":
                fut = dcp.async_save(self.state(), storage_writer=self.writer)
                blocked = time.perf_counter() - t0
                fut.result()
            else:  # vlcc_async_overlap
                resp = dcp.async_save(self.state(), storage_writer=self.writer)
                s0 = time.perf_counter()
                time.sleep(self.overlap)  # the next step's forward and backward passes
                slept = time.perf_counter() - s0
                resp.staging_completion.result()  # before the optimizer step
                blocked = time.perf_counter() - t0 - slept
                resp.upload_completion.result()
        return blocked, time.perf_counter() - t0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.ds is not None:
            if self.vlcc is not None:
                self.vlcc.close()
            self.ds.destroy()


def _stats(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def run(args) -> dict:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="vlcc-bench-training-")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    names = [n for n in BACKENDS if not args.backends or n in args.backends]
    try:
        import deepspeed

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except ImportError:
        names = [n for n in names if not n.startswith("ds_")]
    load = [os.getloadavg()]
    runs = {n: _Run(n, args, root) for n in names}
    first = runs.get("torch_save", runs[names[0]])
    state_bytes = sum(
        t.numel() * t.element_size()
        for t in list(first.model.state_dict().values())
        + [v for s in first.opt.state.values() for v in s.values()]
        if isinstance(t, torch.Tensor)
    )
    samples: dict[str, dict[str, list[float]]] = {
        n: {"cpu_s": [], "blocked_s": [], "wall_s": [], "bytes": []} for n in names
    }
    try:
        for r in range(args.warmup + args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                run_ = runs[n]
                run_.step()  # every tensor changes between checkpoints
                before = _disk_bytes(run_.root)
                c0 = _cpu()
                blocked, wall = run_.checkpoint()
                cpu = _cpu() - c0
                if r >= args.warmup:
                    s = samples[n]
                    s["cpu_s"].append(cpu)
                    s["blocked_s"].append(blocked)
                    s["wall_s"].append(wall)
                    s["bytes"].append(_disk_bytes(run_.root) - before)
    finally:
        for run_ in runs.values():
            run_.close()
        shutil.rmtree(root, ignore_errors=True)
    load.append(os.getloadavg())
    results = {n: {m: _stats(v) for m, v in s.items()} for n, s in samples.items()}

    def ratio(a: str, b: str, m: str) -> float | None:
        if a not in results or b not in results:
            return None
        return results[a][m]["median"] / results[b][m]["median"]

    return {
        "config": {
            k: getattr(args, k) for k in ("width", "layers", "zero", "repeats", "warmup", "overlap")
        },
        "state_bytes": state_bytes,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg": load},
        "results": results,
        "goals": {
            "ds_vlcc_over_ds_default_cpu": ratio("ds_vlcc", "ds_default", "cpu_s"),
            "ds_vlcc_written_over_ds_default_cpu": ratio("ds_vlcc_written", "ds_default", "cpu_s"),
            "ds_vlcc_copy_over_ds_default_cpu": ratio("ds_vlcc_copy", "ds_default", "cpu_s"),
            "ds_vlcc_overlap_over_ds_default_cpu": ratio("ds_vlcc_overlap", "ds_default", "cpu_s"),
            "vlcc_async_over_dcp_async_cpu": ratio("vlcc_async", "dcp_async", "cpu_s"),
            "vlcc_async_over_torch_save_blocked": ratio("vlcc_async", "torch_save", "blocked_s"),
            "vlcc_async_overlap_over_torch_save_blocked": ratio(
                "vlcc_async_overlap", "torch_save", "blocked_s"
            ),
            "ds_vlcc_over_ds_default_blocked": ratio("ds_vlcc", "ds_default", "blocked_s"),
            "ds_vlcc_copy_over_ds_default_blocked": ratio(
                "ds_vlcc_copy", "ds_default", "blocked_s"
            ),
        },
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--zero", type=int, default=1, help="DeepSpeed's ZeRO stage")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--overlap",
        type=float,
        default=0.2,
        help="seconds of forward and backward passes between save and commit (ds_vlcc_overlap)",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        choices=BACKENDS,
        help="measure only these backends (default: all); for profiling one comparison",
    )
    p.add_argument("--quick", action="store_true", help="CI size")
    p.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    p.add_argument("--update-results", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.width, args.layers, args.repeats, args.warmup = 256, 2, 3, 1
    doc = run(args)
    out = os.path.join(HERE, "results") if args.update_results else args.out
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_training.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"state {doc['state_bytes'] / 2**20:.1f} MiB; load {doc['machine']['loadavg']}")
    print(f"{'backend':12s} {'cpu_s':>18s} {'blocked_s':>18s} {'wall_s':>8s} {'MiB':>7s}")
    for n, r in doc["results"].items():
        c, b = r["cpu_s"], r["blocked_s"]
        print(
            f"{n:12s} {c['median']:.4f} [{c['q1']:.3f},{c['q3']:.3f}] "
            f"{b['median']:.4f} [{b['q1']:.3f},{b['q3']:.3f}] "
            f"{r['wall_s']['median']:8.4f} {r['bytes']['median'] / 2**20:7.2f}"
        )
    for k, v in doc["goals"].items():
        print(f"{k}: {v if v is None else round(v, 3)}")


if __name__ == "__main__":
    main()
