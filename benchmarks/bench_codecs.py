"""Benchmark: our codecs against C-Blosc2, ZFP and SZ3 on acoustic wavefields.

Reproduce (from the repository root)::

    . .venv/bin/activate
    python benchmarks/bench_codecs.py --quick     # about a minute
    python benchmarks/bench_codecs.py             # full: a few minutes
    python benchmarks/bench_codecs.py --out DIR   # results elsewhere

Writes ``DIR/bench_codecs.json`` (every number below and every repeat's
time) and ``DIR/bench_codecs.png`` (compression ratio against compression
and decompression throughput, one panel per data set); ``DIR`` defaults to
``$TMPDIR/vlcc-bench-results/``.

Data (all 1024 x 1024):

* ``wave-f32``/``wave-f64``: a 2-D acoustic wavefield, the kind of state an
  adjoint seismic code checkpoints: ``u_tt = c^2 lap u`` with second-order
  finite differences in space and time (Alterman & Karal 1968), three
  layers (1500, 2250, 3000 m/s), dx = 5 m, dt = 0.75 ms (Courant 0.45),
  four 15 Hz Ricker sources, 2000 steps (the wavefronts, reflections and
  the layers' head waves fill most of the grid).  Simulated in float64;
  ``wave-f32`` is the same field rounded to float32.
* ``noise-f32``: standard normal noise (nothing to predict: a lower bound).

Codecs (rows), the lossy ones at the absolute bound ``eb = 1e-4 *
(max - min)`` of each data set:

* ``ours ErrorBounded``: ``ErrorBounded(eb)``, decoding into a reused
  ``out=`` array (how the storage engine calls it);
  ``ours ErrorBounded (new out)``: the same, decoding into a fresh array
  like the peers do.
* ``ours FixedRate(b)``: 8 and 12 bits per value (no ``eb``: its error is
  relative to each block's maximum; the table shows what it reached).
* ``ours Lossless``: ``Lossless()`` (byte shuffle + LZ4, clevel 5).
* ``blosc2 lz4``/``blosc2 zstd``: ``blosc2.compress2`` directly (shuffle,
  clevel 5, one thread): what ``Lossless`` wraps, and a stronger peer.
* ``zfpy``: zfpy 1.0.1 ``compress_numpy(a, tolerance=eb)`` (fixed-accuracy
  mode; ZFP usually lands well inside its tolerance).
* ``SZ3``: pysz ``sz.compress`` with ``errorBoundMode = ABS``,
  ``absErrorBound = eb``, OpenMP off.

Protocol.  Every codec runs once untimed (numba compilation or cache load,
allocation of scratch buffers), then ``--repeats`` rounds interleave the
codecs (a, b, c, a, b, c, ...; each round starting one codec later, so no
codec always follows the same one) so that machine load drifts over all of
them alike; each round times one compression and one decompression.  Throughput
is *per core*: uncompressed bytes divided by the thread's CPU time
(``time.thread_time``; all codecs run single-threaded in the calling
thread), so other processes on a shared machine slow the wall clock more
than the figure; the wall-clock medians and the best (least CPU time) repeat
are in the JSON as well.  The medians are reported; the load average
before and after is recorded.

Columns: ``ratio`` = uncompressed / compressed bytes; ``comp``/``decomp``:
median GB/s per core (1 GB = 1e9 bytes, uncompressed); ``max_err/eb``: the
largest ``|x - x'|`` over the data divided by ``eb`` (must be <= 1 for the
error-bounded codecs); ``ok``: the bound held.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

GB = 1e9


# -- data --------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _leapfrog(u_prev, u, c2, nt, src_y, src_x, wavelet):
    """``nt`` steps of u_next = 2u - u_prev + (c dt/dx)^2 lap u (+ sources)."""
    ny, nx = u.shape
    for it in range(nt):
        for i in range(1, ny - 1):
            for j in range(1, nx - 1):
                lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
                u_prev[i, j] = 2.0 * u[i, j] - u_prev[i, j] + c2[i, j] * lap
        for s in range(src_y.size):
            u_prev[src_y[s], src_x[s]] += wavelet[it]
        u_prev, u = u, u_prev
    return u


def wavefield(n: int = 1024, nt: int = 2000, seed: int = 0) -> np.ndarray:
    """The float64 acoustic wavefield described in the module docstring."""
    dx, dt, f0 = 5.0, 0.75e-3, 15.0
    c = np.full((n, n), 1500.0)
    c[n // 2:] = 2250.0
    c[3 * n // 4:] = 3000.0
    c2 = (c * dt / dx) ** 2
    t = np.arange(nt) * dt
    arg = (np.pi * f0 * (t - 1.2 / f0)) ** 2
    ricker = (1.0 - 2.0 * arg) * np.exp(-arg)
    rng = np.random.default_rng(seed)
    sy = rng.integers(n // 8, 7 * n // 8, 4)
    sx = rng.integers(n // 8, 7 * n // 8, 4)
    return _leapfrog(np.zeros((n, n)), np.zeros((n, n)), c2, nt, sy, sx, ricker)


# -- codecs under test -------------------------------------------------------------


class Case:
    """One codec on one array: compress() -> blob, decompress(blob) -> array."""

    def __init__(self, name, family, compress, decompress, bounded):
        self.name, self.family = name, family
        self.compress, self.decompress, self.bounded = compress, decompress, bounded


def make_cases(a: np.ndarray, eb: float, quick: bool) -> list[Case]:
    import blosc2
    import pysz
    import zfpy

    from vlcc_adjoint.storage.codecs import ErrorBounded, FixedRate, Lossless

    cases = []
    eb_codec = ErrorBounded(eb)
    out = np.empty_like(a)
    cases.append(Case("ours ErrorBounded", "ours", lambda: eb_codec.encode(a),
                      lambda b: eb_codec.decode(b, out=out), True))
    cases.append(Case("ours ErrorBounded (new out)", "ours", lambda: eb_codec.encode(a),
                      lambda b: eb_codec.decode(b), True))
    for bits in ((8,) if quick else (8, 12)):
        fr = FixedRate(bits)
        cases.append(Case(f"ours FixedRate({bits})", "ours", lambda fr=fr: fr.encode(a),
                          lambda b, fr=fr: fr.decode(b, out=out), False))
    lossless = Lossless()
    cases.append(Case("ours Lossless", "ours", lambda: lossless.encode(a),
                      lambda b: lossless.decode(b, out=out), False))

    for label, codec in (("blosc2 lz4", blosc2.Codec.LZ4), ("blosc2 zstd", blosc2.Codec.ZSTD)):
        def comp(codec=codec):
            return blosc2.compress2(a, codec=codec, clevel=5, typesize=a.itemsize,
                                    filters=[blosc2.Filter.SHUFFLE], filters_meta=[0], nthreads=1)

        def decomp(b):
            blosc2.decompress2(b, dst=out, nthreads=1)
            return out

        cases.append(Case(label, "blosc2", comp, decomp, False))

    cases.append(Case("zfpy", "zfp", lambda: zfpy.compress_numpy(a, tolerance=eb),
                      zfpy.decompress_numpy, True))

    cfg = pysz.szConfig(a.shape)
    cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
    cfg.absErrorBound = eb
    cfg.openmp = False
    cases.append(Case("SZ3", "sz3", lambda: pysz.sz.compress(a, cfg)[0],
                      lambda b: pysz.sz.decompress(b, a.dtype, a.shape)[0], True))
    return cases


def _nbytes(blob) -> int:
    return blob.nbytes if isinstance(blob, np.ndarray) else len(blob)


def _timed(fn, *args):
    w0, c0 = time.perf_counter(), time.thread_time()
    result = fn(*args)
    c1, w1 = time.thread_time(), time.perf_counter()
    return result, c1 - c0, w1 - w0


def run_dataset(name: str, a: np.ndarray, repeats: int, quick: bool) -> list[dict]:
    eb = 1e-4 * float(a.max() - a.min())
    cases = make_cases(a, eb, quick)
    blobs, rows = {}, {}
    for case in cases:  # warm-up: compile / load kernels, allocate scratch
        blob = case.compress()
        y = np.asarray(case.decompress(blob)).reshape(a.shape)
        err = float(np.max(np.abs(y.astype(np.float64) - a.astype(np.float64))))
        blobs[case.name] = blob
        rows[case.name] = dict(dataset=name, codec=case.name, family=case.family,
                               dtype=str(a.dtype), shape=list(a.shape), nbytes=a.nbytes,
                               eb=eb, bounded=case.bounded, compressed_nbytes=_nbytes(blob),
                               ratio=a.nbytes / _nbytes(blob), max_err=err,
                               max_err_over_eb=err / eb,
                               bound_ok=(err <= eb) if case.bounded else None,
                               comp_cpu_s=[], comp_wall_s=[], decomp_cpu_s=[],
                               decomp_wall_s=[])
    for rep in range(repeats):  # interleaved: a, b, c, b, c, a, c, a, b, ...
        # (each round starts one codec later, so that no codec always runs right
        # after the same one: what a codec leaves behind, freed pages, evicted
        # caches, changes the next one's time by up to ~25% on these VMs)
        for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            r = rows[case.name]
            blob, cpu, wall = _timed(case.compress)
            r["comp_cpu_s"].append(cpu)
            r["comp_wall_s"].append(wall)
            _, cpu, wall = _timed(case.decompress, blob)
            r["decomp_cpu_s"].append(cpu)
            r["decomp_wall_s"].append(wall)
            del blob
    for r in rows.values():
        for key in ("comp", "decomp"):
            cpu = statistics.median(r[f"{key}_cpu_s"])
            wall = statistics.median(r[f"{key}_wall_s"])
            r[f"{key}_GBps"] = a.nbytes / cpu / GB if cpu > 0 else float("inf")
            r[f"{key}_wall_GBps"] = a.nbytes / wall / GB
            r[f"{key}_best_GBps"] = a.nbytes / max(min(r[f"{key}_cpu_s"]), 1e-9) / GB
    return list(rows.values())


def print_table(rows: list[dict]) -> None:
    head = (f"{'data':<10} {'codec':<28} {'ratio':>7} {'comp':>7} {'decomp':>7} "
            f"{'max_err/eb':>10} {'ok':>4}   (GB/s per core, CPU time)")
    print(head)
    print("-" * len(head))
    last = None
    for r in rows:
        if last is not None and r["dataset"] != last:
            print()
        last = r["dataset"]
        ok = "" if r["bound_ok"] is None else ("yes" if r["bound_ok"] else "NO")
        print(f"{r['dataset']:<10} {r['codec']:<28} {r['ratio']:7.2f} {r['comp_GBps']:7.2f} "
              f"{r['decomp_GBps']:7.2f} {r['max_err_over_eb']:10.3g} {ok:>4}")


def summary(rows: list[dict]) -> list[str]:
    """The project's targets for ErrorBounded, checked against the peers."""
    lines = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        by = {r["codec"]: r for r in rows if r["dataset"] == ds}
        eb, z, s = by["ours ErrorBounded"], by["zfpy"], by["SZ3"]
        vs_z, vs_s = eb["comp_GBps"] / z["comp_GBps"], eb["comp_GBps"] / s["comp_GBps"]
        lines.append(
            f"{ds}: ratio {eb['ratio']:.2f} vs zfpy {z['ratio']:.2f} "
            f"({'met' if eb['ratio'] >= z['ratio'] else 'MISSED'}); compression "
            f"{vs_z:.1f}x zfpy, {vs_s:.1f}x SZ3 ({'met' if min(vs_z, vs_s) >= 5 else 'MISSED'}"
            f" >= 5x); decompression {eb['decomp_GBps']:.2f} GB/s per core "
            f"({'met' if eb['decomp_GBps'] >= 2 else 'MISSED'} >= 2)")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(2, len(datasets), figsize=(5.2 * len(datasets), 8.5), squeeze=False)
    colors = {"ours": "tab:red", "blosc2": "tab:gray", "zfp": "tab:blue", "sz3": "tab:green"}
    markers = {"ours ErrorBounded": "*", "ours ErrorBounded (new out)": "P", "ours Lossless": "s",
               "blosc2 lz4": "s", "blosc2 zstd": "D", "zfpy": "o", "SZ3": "^"}
    for col, ds in enumerate(datasets):
        for row, key in enumerate(("comp", "decomp")):
            ax = axes[row][col]
            for r in (r for r in rows if r["dataset"] == ds):
                ax.scatter(r[f"{key}_GBps"], r["ratio"], s=90, color=colors[r["family"]],
                           marker=markers.get(r["codec"], "v"), label=r["codec"])
                below = r["codec"].endswith("(new out)") or r["codec"] == "blosc2 lz4"
                ax.annotate(r["codec"].replace("ours ", ""), (r[f"{key}_GBps"], r["ratio"]),
                            fontsize=7, xytext=(4, -9 if below else 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(FormatStrFormatter("%g"))
                axis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel(f"{'compression' if key == 'comp' else 'decompression'} GB/s per core")
            ax.set_ylabel("compression ratio")
            ax.set_title(f"{ds}, eb = 1e-4 x range" if row == 0 else ds, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and configurations")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5/25)")
    parser.add_argument("--out", type=Path, default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"))
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 25)
    args.out.mkdir(parents=True, exist_ok=True)

    import blosc2
    import pysz  # noqa: F401
    import zfpy

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    u64 = wavefield()
    t_sim = time.perf_counter() - t0
    datasets = {"wave-f32": u64.astype(np.float32), "wave-f64": u64,
                "noise-f32": np.random.default_rng(1).standard_normal((1024, 1024)).astype(
                    np.float32)}
    print(f"wavefield simulated in {t_sim:.1f} s; load average {load_before}")
    rows = []
    for name, a in datasets.items():
        rows.extend(run_dataset(name, a, repeats, args.quick))
    load_after = os.getloadavg()
    print_table(rows)
    print()
    lines = summary(rows)
    for line in lines:
        print(line)
    print(f"load average before {load_before}, after {load_after}; {os.cpu_count()} CPUs")

    meta = dict(quick=args.quick, repeats=repeats, load_before=load_before, load_after=load_after,
                cpu_count=os.cpu_count(), platform=platform.platform(),
                processor=platform.processor(), python=platform.python_version(),
                numpy=np.__version__, numba=numba.__version__, blosc2=blosc2.__version__,
                zfpy=getattr(zfpy, "__version__", "1.0.1"), simulate_s=t_sim, summary=lines,
                seconds=time.perf_counter() - t0)
    with open(args.out / "bench_codecs.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    plot(rows, args.out / "bench_codecs.png")
    print(f"wrote {args.out / 'bench_codecs.json'} and {args.out / 'bench_codecs.png'} "
          f"in {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
