"""Benchmark: checkpoint I/O hidden behind computation by the asynchronous engine.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_overlap.py --quick       # < 1 minute
    python benchmarks/bench_overlap.py               # full: ~2-3 minutes
    python benchmarks/bench_overlap.py --dir /scratch --out DIR

Writes ``DIR/bench_overlap.json`` (``DIR`` defaults to
``$TMPDIR/vlcc-bench-results/``): the configuration, the machine, the load average
before and after, every repeat and every median; prints two tables.

The solver.  A 2-D acoustic wave equation on an ``N x N`` float64 grid
(``N = 1024``: 8 MiB a field), second order in time, 5-point Laplacian,
leap-frog ``u+ = 2u - u- + (c dt/h)^2 lap(u)``, written as a single-threaded
numba kernel that releases the GIL and updates ping-pong buffers in place
(as Devito and most PDE codes do).  The state is ``{"u": u, "u_prev": u-}``
(16 MiB).  Single-threaded on purpose: the machine has 2 cores, one for the
solver, one for the store's workers.

(a) Forward: ``--steps`` time steps, saving every ``--every``-th state to
a :class:`~vlcc_adjoint.storage.ZarrTier` on ``--dir`` (page cache, no
fsync: ZarrTier's default).  Modes:

* ``compute``: no checkpoints (the floor);
* ``copy only``: at each checkpoint, ``np.copyto`` of the state into
  preallocated, already written arrays and nothing else: the floor of any
  capture, measured in the loop (cold caches, the solver's memory traffic);
* ``zarr API``: plain zarr-python writes in the loop (``zarr.create_array``
  + ``arr[...] = x`` per leaf, no compression): the straightforward way;
* ``sync``: ``TieredStore([ZarrTier], workers=0)``: the same engine, every
  write in the caller;
* ``async``: ``TieredStore([ZarrTier])`` with its default number of
  workers (one fewer than the cores, at least 1: one here, on 2 cores, so
  that the solver and the worker each have a core), staging budget
  ``--staging`` states;
* ``async w2``: the same with two worker threads;
* ``sync fsync``, ``async fsync``: ``sync`` and ``async`` with
  ``ZarrTier(durable=True)``: every record is fsynced before it counts as
  written (checkpoints that survive a power cut).  Waiting for the device is
  work that needs no CPU, the case overlap is made for.

Total time includes the final flush (``close``).  Two measures of overlap:
``hidden (ext)`` ``= (T_sync - T_async) / (T_sync - T_compute)``, the share of
the synchronous I/O time that disappeared from the wall clock (each async
mode against the sync mode of the same tier); and
``hidden (stats)``, the store's own ``StoreStats.hidden_fraction``
(background I/O seconds the caller did not wait for; see
``vlcc_adjoint/storage/_stats.py``).  ``stall`` is the caller's blocked time
inside ``save`` and ``close``; ``capture GB/s`` the bandwidth of the
capture copies (for ``copy only``: of its copies), and ``/copy`` its ratio
to ``copy only``'s (the capture-efficiency target is >= 0.7).  The table's
footer also gives ``np.copyto`` back to back into a reused array (hot
caches), the figure ``bench_tiers.py`` reports.

(b) Backward: ``--back`` states saved to the ZarrTier by
``StoreAll(back, level=1)``, their files written back and dropped from the
page cache (``fsync`` + ``posix_fadvise(DONTNEED)``; ``--warm`` keeps them
cached), then the schedule's backward pass: each ``Load`` into the solver's
buffers (``out=``) followed by an adjoint step costing ``--adjoint`` stencil
sweeps, each record ``Delete``\\ d after use.  Timed: the backward pass only.
Modes: ``prefetch off`` (``prefetch_bytes=0``: every load reads the tier in
the caller) and ``prefetch on`` (``prefetch_bytes`` = ``--cache`` states,
with the schedule's ``io_plan``).  Reported: time, stall seconds, prefetch
hits / misses.  As in a real run, ``prefetch on`` also keeps the last
captures of the forward sweep in its cache (write-through, up to the
budget), so its first loads need no read at all; the later ones are read
ahead during the backward pass.

Reading the numbers.  The stencil streams three 8 MiB fields per step: it
is bound by memory bandwidth, and so is writing to the page cache (a copy
into kernel memory) and hashing.  Run concurrently, they share the memory
bus and the two cores, so the background write of a page-cache tier slows
the solver about as much as it saves; the store's stall drops, the wall
clock barely moves.  Waiting for the device (``fsync``) costs no bandwidth:
that is what the engine hides.  The backward pass is read-bound: prefetch
can hide at most the adjoint steps' compute under the reads.

Protocol.  Modes run interleaved, in rotating order, ``--repeats`` times;
medians are reported, and ratios of medians.  The load average of the
machine (a shared 2-core VM) is recorded before and after: numbers taken
while it is high are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vlcc_adjoint.schedules import Delete, Load, StoreAll, io_plan  # noqa: E402
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@numba.njit(nogil=True, cache=True)
def _leapfrog(u, up, c2):
    """One leap-frog step in place: ``up`` becomes u_{t+1} (it held u_{t-1})."""
    n, m = u.shape
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
            up[i, j] = 2.0 * u[i, j] - up[i, j] + c2 * lap


class Wave:
    """The solver: two ping-pong fields advanced in place."""

    def __init__(self, n):
        x = np.linspace(-1, 1, n)
        self.u = np.exp(-200 * (x[:, None] ** 2 + x[None, :] ** 2))
        self.up = self.u.copy()
        self.c2 = 0.2

    def step(self):
        _leapfrog(self.u, self.up, self.c2)
        self.u, self.up = self.up, self.u

    def state(self):
        return {"u": self.u, "u_prev": self.up}


# -- (a) forward ----------------------------------------------------------------------


def _forward(mode, args, scratch):
    solver = Wave(args.n)
    path = tempfile.mkdtemp(dir=scratch, prefix=f"fwd-{mode.replace(' ', '_')}-")
    store = None
    if mode.startswith(("sync", "async")):
        state_bytes = 2 * args.n * args.n * 8
        workers = 0 if mode.startswith("sync") else 2 if mode == "async w2" else None
        store = TieredStore(
            [ZarrTier(path, durable=mode.endswith("fsync"))],
            workers=workers,
            staging_bytes=args.staging * state_bytes,
        )
    if mode == "zarr API":
        import zarr

        root = zarr.open_group(path, mode="w")
    if mode == "copy only":
        buffers = {k: np.ones_like(v) for k, v in solver.state().items()}
        copy_s = 0.0
        copied = 0
    t0 = time.perf_counter()
    for i in range(args.steps + 1):
        if i % args.every == 0:
            if store is not None:
                store.save(i, solver.state())
            elif mode == "copy only":
                tc = time.perf_counter()
                for k, v in solver.state().items():
                    np.copyto(buffers[k], v)
                    copied += v.nbytes
                copy_s += time.perf_counter() - tc
            elif mode == "zarr API":
                group = root.create_group(f"u{i}")
                for name, leaf in solver.state().items():
                    arr = group.create_array(
                        name,
                        shape=leaf.shape,
                        dtype=leaf.dtype,
                        chunks=leaf.shape,
                        compressors=None,
                    )
                    arr[...] = leaf
        if i < args.steps:
            solver.step()
    stats = None
    if store is not None:
        store.close()
        stats = store.stats()
    total = time.perf_counter() - t0
    shutil.rmtree(path, ignore_errors=True)
    out = {"total_s": total}
    if mode == "copy only":
        out["capture_gbs"] = copied / copy_s / 1e9
    if stats is not None:
        out.update(
            stall_s=stats.stall_seconds + stats.flush_seconds,
            save_stall_s=stats.stall_seconds,
            flush_s=stats.flush_seconds,
            io_s=stats.io_seconds,
            hidden_stats=stats.hidden_fraction,
            capture_gbs=stats.capture_bandwidth / 1e9,
            pool_reused=stats.pool_reused,
            pool_allocated=stats.pool_allocated,
        )
    return out


# -- (b) backward -----------------------------------------------------------------------


def _drop_cache(path):
    """Write back and drop every file under `path` from the page cache."""
    for d, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _backward(mode, args, scratch):
    n = args.back
    schedule = StoreAll(n, level=1)
    solver = Wave(args.n)
    state_bytes = 2 * args.n * args.n * 8
    path = tempfile.mkdtemp(dir=scratch, prefix="bwd-")
    cache = args.cache * state_bytes if mode == "prefetch on" else 0
    store = TieredStore(
        [MemoryTier(), ZarrTier(path)], plan=io_plan(schedule), prefetch_bytes=cache
    )
    actions = list(schedule)
    first_load = next(k for k, a in enumerate(actions) if isinstance(a, Load))
    for a in actions[:first_load]:  # the forward sweep (not timed)
        if type(a).__name__ == "Advance":
            for _ in range(a.stop - a.start):
                solver.step()
        elif type(a).__name__ == "Save":
            store.save(a.step, solver.state(), a.level)
    store.wait()
    if not args.warm:
        _drop_cache(path)
    before = store.stats()
    buffers = solver.state()
    t0 = time.perf_counter()
    for a in actions[first_load:]:
        if isinstance(a, Load):
            got = store.load(a.step, a.level, out=buffers)
            assert got is buffers
            for _ in range(args.adjoint):  # the adjoint step's work
                _leapfrog(buffers["u"], buffers["u_prev"], 0.0)
        elif isinstance(a, Delete):
            store.delete(a.step, a.level)
    total = time.perf_counter() - t0
    after = store.stats()
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "total_s": total,
        "stall_s": after.stall_seconds - before.stall_seconds,
        "hits": after.prefetch_hits,
        "misses": after.prefetch_misses,
        "peak_cache_MiB": after.peak_cache_bytes / 2**20,
    }


# -- driver -----------------------------------------------------------------------------


def _interleaved(fn, modes, args, scratch, repeats):
    runs = {m: [] for m in modes}
    for r in range(repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for mode in order:
            result = fn(mode, args, scratch)
            result["load1"] = os.getloadavg()[0]  # the machine's load right after the run
            runs[mode].append(result)
    return runs


def _median(runs, key):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (< 2 minutes)")
    parser.add_argument("--n", type=int, default=1024, help="grid size N (N x N float64)")
    parser.add_argument("--steps", type=int, default=None, help="forward time steps")
    parser.add_argument("--every", type=int, default=20, help="save every k-th state")
    parser.add_argument("--staging", type=int, default=4, help="staging budget, in states")
    parser.add_argument("--back", type=int, default=None, help="states read back (backward)")
    parser.add_argument(
        "--adjoint",
        type=int,
        default=4,
        help="stencil sweeps per adjoint step in the backward pass",
    )
    parser.add_argument("--cache", type=int, default=4, help="prefetch budget, in states")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="backward: read from the page cache (default: drop it first)",
    )
    parser.add_argument("--dir", default=None, help="scratch directory for the zarr tiers")
    parser.add_argument(
        "--out",
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
        help="directory for bench_overlap.json",
    )
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 150 if args.quick else 400
    if args.back is None:
        args.back = 16 if args.quick else 40
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    scratch = tempfile.mkdtemp(dir=args.dir, prefix="vlcc-bench-overlap-")
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    try:
        # Warm-up: numba compile / cache load, imports, first-touch of the allocator.
        warm = argparse.Namespace(**{**vars(args), "steps": 20, "every": 10, "back": 3})
        _forward("async", warm, scratch)
        _backward("prefetch on", warm, scratch)
        t = time.perf_counter()
        w = Wave(args.n)
        for _ in range(20):
            w.step()
        step_s = (time.perf_counter() - t) / 20

        src = np.random.default_rng(0).random((2, args.n, args.n))
        dst = np.empty_like(src)
        times = []
        for _ in range(15):
            t = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t)
        copyto_gbs = src.nbytes / statistics.median(times[3:]) / 1e9
        del src, dst

        fmodes = [
            "compute",
            "copy only",
            "zarr API",
            "sync",
            "async",
            "async w2",
            "sync fsync",
            "async fsync",
        ]
        fruns = _interleaved(_forward, fmodes, args, scratch, args.repeats)
        bmodes = ["prefetch off", "prefetch on"]
        bruns = _interleaved(_backward, bmodes, args, scratch, args.repeats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()

    fmed = {m: {k: _median(fruns[m], k) for k in fruns[m][0]} for m in fmodes}
    t_c, t_s, t_a = (fmed[m]["total_s"] for m in ("compute", "sync", "async"))
    hidden_ext = (t_s - t_a) / (t_s - t_c) if t_s > t_c else None
    saves = args.steps // args.every + 1
    state_mib = 2 * args.n * args.n * 8 / 2**20
    print(
        f"\n(a) forward: {args.steps} steps of a {args.n}^2 wave equation "
        f"({step_s * 1e3:.1f} ms/step), {saves} saves of {state_mib:.0f} MiB to a ZarrTier; "
        f"medians of {args.repeats}"
    )
    copy_gbs = fmed["copy only"]["capture_gbs"]
    print(
        f"{'mode':<11} {'total_s':>8} {'vs compute':>10} {'vs sync':>8} {'stall_s':>8} "
        f"{'io_s':>7} {'hidden(ext)':>11} {'hidden(stats)':>13} {'capture GB/s':>12} "
        f"{'/copy':>5}"
    )
    for m in fmodes:
        r = fmed[m]
        base = fmed["sync fsync" if m.endswith("fsync") else "sync"]["total_s"]
        ext = (base - r["total_s"]) / (base - t_c) if m.startswith("async") and base > t_c else None
        cap = r.get("capture_gbs")
        print(
            f"{m:<11} {r['total_s']:>8.3f} {r['total_s'] / t_c:>10.2f} "
            f"{r['total_s'] / base:>8.2f} "
            f"{_fmt(r.get('stall_s'), '8.3f'):>8} {_fmt(r.get('io_s'), '7.3f'):>7} "
            f"{_fmt(ext, '11.2f'):>11} {_fmt(r.get('hidden_stats'), '13.2f'):>13} "
            f"{_fmt(cap, '12.2f'):>12} "
            f"{_fmt(None if cap is None else cap / copy_gbs, '5.2f'):>5}"
        )
    print(
        f"np.copyto back to back into a reused array: {copyto_gbs:.2f} GB/s.  async / sync = "
        f"{t_a / t_s:.2f}; overhead over compute: sync {t_s - t_c:.3f} s, async "
        f"{t_a - t_c:.3f} s"
    )

    bmed = {m: {k: _median(bruns[m], k) for k in bruns[m][0]} for m in bmodes}
    off, on = bmed["prefetch off"], bmed["prefetch on"]
    print(
        f"\n(b) backward: {args.back - 1} loads of {state_mib:.0f} MiB from the ZarrTier "
        f"({'warm' if args.warm else 'cold'} page cache), {args.adjoint} sweeps per adjoint "
        f"step; medians of {args.repeats}"
    )
    print(
        f"{'mode':<13} {'total_s':>8} {'stall_s':>8} {'hits':>5} {'misses':>6} "
        f"{'peak cache MiB':>14}"
    )
    for m in bmodes:
        r = bmed[m]
        print(
            f"{m:<13} {r['total_s']:>8.3f} {r['stall_s']:>8.3f} {r['hits']:>5.0f} "
            f"{r['misses']:>6.0f} {r['peak_cache_MiB']:>14.0f}"
        )
    ratio = on["stall_s"] / off["stall_s"] if off["stall_s"] > 0 else None
    print(
        f"stall on / off = {_fmt(ratio, '.2f')}; time on / off = "
        f"{on['total_s'] / off['total_s']:.2f}"
    )
    print(
        f"\nload average before {load_before}, after {load_after}; "
        f"{time.perf_counter() - t_start:.0f} s in all"
    )

    result = {
        "benchmark": "bench_overlap",
        "args": vars(args),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
        },
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "step_seconds": step_s,
        "copyto_gbs": copyto_gbs,
        "forward": {
            "medians": fmed,
            "runs": fruns,
            "async_over_sync": t_a / t_s,
            "hidden_external": hidden_ext,
            "async_over_sync_fsync": fmed["async fsync"]["total_s"] / fmed["sync fsync"]["total_s"],
        },
        "backward": {
            "medians": bmed,
            "runs": bruns,
            "stall_on_over_off": ratio,
            "time_on_over_off": on["total_s"] / off["total_s"],
        },
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_overlap.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
