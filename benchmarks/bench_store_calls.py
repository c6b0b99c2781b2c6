"""Benchmark: what one ``TieredStore`` call costs on a memory level, against
a bare ``np.copyto`` of the same bytes, and in a real adjoint run.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_store_calls.py --quick          # ~1 minute
    python benchmarks/bench_store_calls.py                  # ~3-5 minutes
    # before/after: another version of the package, side by side
    mkdir -p /tmp/vlcc_orig && git archive <commit> vlcc_adjoint | tar -x -C /tmp/vlcc_orig
    python benchmarks/bench_store_calls.py --baseline /tmp/vlcc_orig
    # the calls of a single-threaded store (TieredStore(threadsafe=False)),
    # in the versions that have one (the others: their default store)
    python benchmarks/bench_store_calls.py --quick --single-threaded --baseline /tmp/vlcc_orig

Writes ``DIR/bench_store_calls.json`` (every repeat, every median, the
machine's load average around every measurement; ``--out DIR``, default
``$TMPDIR/vlcc-bench-results/``) and ``bench_store_calls.png``; prints two tables.

Every measurement runs in a fresh interpreter.  With ``--baseline DIR``
(a directory holding another ``vlcc_adjoint`` package) the runs alternate
between that version ("before") and this working tree ("after"), round by
round, in alternating order, and the tables give the medians over rounds
and, per call (row ``a/b``), the median over rounds of the paired ratio
after / before, each a multiple of its own round's copy: on a shared
machine, interleaving is what makes two versions comparable.

(a) Calls.  States ``{"u": x}`` of one float64 array of 64 KiB, 1.44 MB
(the 300 x 300 seismic state's size) or 16 MiB, in a
``TieredStore([MemoryTier()])``, taken in turn from a ring of distinct
states (16 MiB or more in all), so that, as in a run, the data a call
touches is not in the caches.  Each repeat times, one call each:
``np.copyto`` of the state into a preallocated, already written array (the
floor); ``save``; ``wait`` (``settle``: the time until a background write
is done, which a version that writes memory records on a worker defers
past ``save``); and, on the oldest record in the ring (saved a ring's
length of calls before), ``load(out=...)`` (restore into the caller's
arrays), ``load()`` (a copy the caller owns) and ``load(copy=False)``
(read-only views, where the version has it); then ``delete`` and ``wait``,
untimed.  Medians over the repeats, in microseconds, and as a multiple of
the copy.

(b) A real run: the 2-D acoustic FWI gradient of
:class:`vlcc_adjoint._examples.SeismicProblem` (``nx = nz = 300``, ``nt =
2000``: a 1.44 MB state, ~0.2 ms a forward step) under ``Revolve(2000,
10)`` with ``run_adjoint``'s default store, after a short warm-up run.
Reported: wall time, time in store calls (``AdjointResult.stall_seconds``:
save, load, delete, move and the final flush), forward and adjoint time;
and, as the floor, the same run in the same process with
:class:`CopyOnlyStore`, whose ``save`` and ``load`` are nothing but the
``np.copyto`` of each field into and out of reused buffers: its store-call
time is what the copies alone cost, in situ (caches, memory traffic and
all), and its wall time what a run with free checkpointing would take.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

SIZES = {"64 KiB": (64, 128), "1.44 MB": (300, 600), "16 MiB": (2048, 1024)}
REPEATS = {"64 KiB": 1500, "1.44 MB": 300, "16 MiB": 40}
OPS = ("copyto", "save", "settle", "load_out", "load_copy", "load_view")


# -- children: one measurement each, in a fresh interpreter -------------------------


def child_calls(quick: bool, single_threaded: bool = False) -> dict:
    import inspect

    import vlcc_adjoint
    from vlcc_adjoint.storage import MemoryTier, TieredStore

    views = "copy" in inspect.signature(TieredStore.load).parameters
    options = {}
    if single_threaded and "threadsafe" in inspect.signature(TieredStore).parameters:
        options = {"threadsafe": False}
    out = {"package": vlcc_adjoint.__file__, "sizes": {}, "single_threaded": bool(options)}
    for name, shape in SIZES.items():
        reps = REPEATS[name] // (3 if quick else 1)
        rng = np.random.default_rng(0)
        # A ring of `ring` states (and as many records), at least 16 MiB in
        # all: every call touches data that is not in the caches, as in a
        # run, where a record is loaded long after it was saved.
        nbytes = int(np.prod(shape)) * 8
        ring = max(2, -(-(16 << 20) // nbytes))
        sources = [rng.standard_normal(shape) for _ in range(ring)]
        dsts = [np.zeros(shape) for _ in range(ring)]
        back = np.zeros(shape)
        times = {op: [] for op in OPS}
        with TieredStore([MemoryTier()], **options) as store:
            into = {"u": back}
            for r in range(reps + ring + 5):
                k = r % ring
                t0 = time.perf_counter()
                np.copyto(dsts[k], sources[k])
                t1 = time.perf_counter()
                store.save(r, {"u": sources[k]})
                t2 = time.perf_counter()
                store.wait()
                t3 = time.perf_counter()
                sources[k][0, 0] += 1.0  # the caller moves on
                old = r - ring + 1  # the oldest record: saved ring - 1 calls ago
                if old < 0:
                    continue
                t3b = time.perf_counter()
                store.load(old, out=into)
                t4 = time.perf_counter()
                got = store.load(old)
                t5 = time.perf_counter()
                del got
                if views:
                    t6 = time.perf_counter()
                    got = store.load(old, copy=False)
                    t7 = time.perf_counter()
                    del got
                    times["load_view"].append(t7 - t6)
                store.delete(old)
                store.wait()
                for op, dt in zip(OPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3b, t5 - t4)):
                    times[op].append(dt)
        out["sizes"][name] = {op: float(np.median(v[5:]) * 1e6) for op, v in times.items() if v}
        out["sizes"][name].update(nbytes=nbytes, ring=ring)
    return out


def child_kernels(quick: bool) -> dict:
    """The checksum paths alone (this tree only): one leaf per call, taken
    in turn from a ring of distinct leaves of 16 MiB or more in all."""
    import xxhash

    from vlcc_adjoint.storage._checksum import _build, copy_checksum, leaf_checksum

    assert _build(), "the checksum kernel did not build"
    paths = {
        "copyto": lambda s, d: np.copyto(d, s),
        "xxh3 (C)": lambda s, d: xxhash.xxh3_64_hexdigest(s),
        "copyto + xxh3": lambda s, d: (np.copyto(d, s), xxhash.xxh3_64_hexdigest(d)),
        "kernel hash": lambda s, d: leaf_checksum(s),
        "fused": lambda s, d: copy_checksum(s, d),
        "fused, streamed": lambda s, d: copy_checksum(s, d, stream=True),
    }
    out = {}
    for name, shape in SIZES.items():
        reps = REPEATS[name] // (3 if quick else 1)
        nbytes = int(np.prod(shape)) * 8
        ring = max(2, -(-(16 << 20) // nbytes))
        rng = np.random.default_rng(1)
        sources = [rng.standard_normal(shape) for _ in range(ring)]
        dsts = [np.zeros(shape) for _ in range(ring)]
        times = {p: [] for p in paths}
        for p, f in paths.items():  # a pass over the ring each: every call on cold data
            for r in range(reps + ring):
                k = r % ring
                t = time.perf_counter()
                f(sources[k], dsts[k])
                times[p].append(time.perf_counter() - t)
        out[name] = {p: float(np.median(v[ring:]) * 1e6) for p, v in times.items()}
    return out


class CopyOnlyStore:
    """The floor of any store: ``save`` is an ``np.copyto`` of each field
    into a preallocated, reused buffer, ``load(out=)`` an ``np.copyto`` back;
    no checksums, no plan, no bookkeeping beyond a dict."""

    def __init__(self):
        self.held, self.free = {}, []

    @staticmethod
    def _fields(state):
        import dataclasses

        return [getattr(state, f.name) for f in dataclasses.fields(state)]

    def save(self, step, state, level=0):
        fields = self._fields(state)
        bufs = self.free.pop() if self.free else [np.empty_like(a) for a in fields]
        for b, a in zip(bufs, fields):
            np.copyto(b, a)
        self.held[step, level] = bufs

    def load(self, step, level=None, out=None):
        for b, a in zip(self._fields(out), self.held[step, level]):
            np.copyto(b, a)
        return out

    def delete(self, step, level=None):
        self.free.append(self.held.pop((step, level)))

    def wait(self):
        pass

    def stats(self):
        return None

    def close(self):
        pass


def child_seismic(nt: int, slots: int) -> dict:
    import vlcc_adjoint
    from vlcc_adjoint._examples import SeismicProblem
    from vlcc_adjoint.execute import run_adjoint
    from vlcc_adjoint.schedules import Revolve

    p = SeismicProblem(nx=300, nz=300, nt=nt)
    _ = p.d_obs
    run_adjoint(p, Revolve(min(nt, 100), 5), p.initial_state(), p.final_adjoint)  # warm-up
    t0 = time.perf_counter()
    r = run_adjoint(p, Revolve(nt, slots), p.initial_state(), p.final_adjoint)
    wall = time.perf_counter() - t0
    s = r.store_stats
    # The same run with the copy-only store: the copies alone, in situ.
    t0 = time.perf_counter()
    c = run_adjoint(
        p, Revolve(nt, slots), p.initial_state(), p.final_adjoint, store=CopyOnlyStore()
    )
    copy_wall = time.perf_counter() - t0
    from vlcc_adjoint.state import flatten

    assert all(np.array_equal(a, b) for a, b in zip(flatten(c.adjoint)[0], flatten(r.adjoint)[0]))
    return {
        "package": vlcc_adjoint.__file__,
        "wall": wall,
        "store": r.stall_seconds,
        "forward": r.forward_seconds,
        "adjoint": r.adjoint_seconds,
        "saves": s.saves,
        "loads": s.loads,
        "copy_store": c.stall_seconds,
        "copy_wall": copy_wall,
    }


# -- the driver ------------------------------------------------------------------------


def run_child(kind: str, version: str, baseline: str | None, args) -> dict:
    path = baseline if version == "before" else ROOT
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [path] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--nt",
        str(args.nt),
        "--slots",
        str(args.slots),
    ] + (["--quick"] if args.quick else [])
    cmd += ["--single-threaded"] if args.single_threaded else []
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} ({version}) failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(
        version=version,
        loadavg_before=load0,
        loadavg_after=os.getloadavg(),
        seconds=time.perf_counter() - t0,
    )
    return result


def median_of(runs, *keys):
    values = []
    for r in runs:
        v = r
        for k in keys:
            v = v[k]
        values.append(v)
    return float(np.median(values))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--baseline",
        help="a directory holding another vlcc_adjoint package "
        "(the 'before' version), run side by side with this tree",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats, a shorter run")
    parser.add_argument("--nt", type=int, default=None, help="seismic time steps (2000)")
    parser.add_argument("--slots", type=int, default=10, help="Revolve slots (10)")
    parser.add_argument("--skip-seismic", action="store_true")
    parser.add_argument(
        "--single-threaded",
        action="store_true",
        help="(a) on TieredStore(threadsafe=False) where the version has it",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    parser.add_argument("--child", choices=["calls", "seismic", "kernels"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nt is None:
        args.nt = 600 if args.quick else 2000
    if args.child == "calls":
        print(json.dumps(child_calls(args.quick, args.single_threaded)))
        return
    if args.child == "seismic":
        print(json.dumps(child_seismic(args.nt, args.slots)))
        return
    if args.child == "kernels":
        print(json.dumps(child_kernels(args.quick)))
        return

    versions = ["before", "after"] if args.baseline else ["after"]
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    runs = {
        "calls": {v: [] for v in versions},
        "seismic": {v: [] for v in versions},
        "kernels": {"after": []},
    }
    kinds = ["kernels", "calls"] + ([] if args.skip_seismic else ["seismic"])
    for rnd in range(args.rounds):
        order = versions if rnd % 2 == 0 else versions[::-1]
        for kind in kinds:
            for version in order if kind != "kernels" else ["after"]:
                result = run_child(kind, version, args.baseline, args)
                runs[kind][version].append(result)
                print(
                    f"round {rnd + 1}/{args.rounds} {kind:8s} {version:6s} "
                    f"load {result['loadavg_before'][0]:.2f} ({result['seconds']:.0f} s)",
                    flush=True,
                )
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()

    # Tables.
    summary = {"calls": {}, "seismic": {}, "kernels": {}}
    print(
        f"\n(0) checksum paths, one leaf, median of {args.rounds} rounds of medians "
        "(microseconds; x = multiple of np.copyto)"
    )
    kpaths = list(runs["kernels"]["after"][0]["64 KiB"])
    print(f"{'leaf':8s} " + " ".join(f"{p:>22s}" for p in kpaths))
    for name in SIZES:
        row = {p: median_of(runs["kernels"]["after"], name, p) for p in kpaths}
        summary["kernels"][name] = row
        print(
            f"{name:8s} "
            + " ".join(f"{row[p]:12.1f} ({row[p] / row['copyto']:5.2f}x)" for p in kpaths)
        )
    print(
        f"\n(a) per call, memory level, median of {args.rounds} rounds of medians "
        "(microseconds; x = multiple of np.copyto of the same bytes)"
    )
    head = f"{'state':8s} {'version':7s} " + " ".join(f"{op:>17s}" for op in OPS)
    print(head)
    print("-" * len(head))
    for name in SIZES:
        summary["calls"][name] = {}
        for v in versions:
            rs = runs["calls"][v]
            row = {op: median_of(rs, "sizes", name, op) for op in OPS if op in rs[0]["sizes"][name]}
            copy = row["copyto"]
            summary["calls"][name][v] = {op: {"us": t, "x_copy": t / copy} for op, t in row.items()}
            cells = [
                f"{row[op]:9.1f} ({row[op] / copy:4.2f}x)" if op in row else f"{'-':>17s}"
                for op in OPS
            ]
            print(f"{name:8s} {v:7s} " + " ".join(cells))
        if args.baseline:
            # Round by round, after / before of each call's multiple of its
            # round's copy: the load of a shared machine drifts between
            # rounds, less within one.
            pairs = list(zip(runs["calls"]["before"], runs["calls"]["after"]))
            paired = {}
            for op in OPS:
                if all(op in r["sizes"][name] for pair in pairs for r in pair):
                    paired[op] = float(
                        np.median(
                            [
                                (a["sizes"][name][op] / a["sizes"][name]["copyto"])
                                / (b["sizes"][name][op] / b["sizes"][name]["copyto"])
                                for b, a in pairs
                            ]
                        )
                    )
            summary["calls"][name]["paired_after_over_before"] = paired
            print(
                f"{name:8s} {'a/b':7s} "
                + " ".join(f"{paired[op]:17.2f}" if op in paired else f"{'-':>17s}" for op in OPS)
            )
    if "seismic" in kinds:
        print(
            f"\n(b) seismic 300 x 300, nt = {args.nt}, Revolve({args.nt}, {args.slots}), "
            f"median of {args.rounds} (seconds)"
        )
        print(
            f"{'version':7s} {'wall':>7s} {'store':>7s} {'copies':>7s} {'its wall':>9s} "
            f"{'forward':>8s} {'adjoint':>8s} {'saves':>6s} {'loads':>6s}"
        )
        for v in versions:
            rs = runs["seismic"][v]
            row = {
                k: median_of(rs, k)
                for k in (
                    "wall",
                    "store",
                    "copy_store",
                    "copy_wall",
                    "forward",
                    "adjoint",
                    "saves",
                    "loads",
                )
            }
            summary["seismic"][v] = row
            print(
                f"{v:7s} {row['wall']:7.2f} {row['store']:7.2f} {row['copy_store']:7.2f} "
                f"{row['copy_wall']:9.2f} {row['forward']:8.2f} {row['adjoint']:8.2f} "
                f"{row['saves']:6.0f} {row['loads']:6.0f}"
            )
        print(
            "copies: store-call time of the same run with a store that only copies "
            "(np.copyto in and out of reused buffers), in the same process"
        )
    print(f"\nload: {uptime_before}\n   -> {uptime_after}")

    os.makedirs(args.out, exist_ok=True)
    result = {
        "benchmark": "bench_store_calls",
        "argv": sys.argv[1:],
        "quick": args.quick,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "nt": args.nt,
        "slots": args.slots,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "uptime_before": uptime_before,
        "uptime_after": uptime_after,
        "summary": summary,
        "runs": runs,
    }
    path = os.path.join(args.out, "bench_store_calls.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {path}")
    plot(summary, versions, os.path.join(args.out, "bench_store_calls.png"))


def plot(summary, versions, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ops = ["save + settle", "load_out", "load_copy", "load_view"]
    fig, axes = plt.subplots(1, len(SIZES), figsize=(4 * len(SIZES), 3.4), sharey=True)
    for ax, name in zip(axes, SIZES):
        width = 0.8 / len(versions)
        for j, v in enumerate(versions):
            cells = dict(summary["calls"][name][v])
            # A save is done when its record is: count the background part too.
            cells["save + settle"] = {"x_copy": cells["save"]["x_copy"] + cells["settle"]["x_copy"]}
            ys = [cells[op]["x_copy"] if op in cells else 0.0 for op in ops]
            ax.bar(np.arange(len(ops)) + j * width, ys, width, label=v)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.5, color="k", lw=0.8, ls=":")
        ax.set_xticks(np.arange(len(ops)) + width * (len(versions) - 1) / 2, ops, rotation=30)
        ax.set_title(name)
    axes[0].set_ylabel("time / np.copyto")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
