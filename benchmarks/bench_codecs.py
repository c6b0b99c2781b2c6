"""Benchmark: our codecs against C-Blosc2, ZFP and SZ3 on acoustic wavefields,
the lossy ones compared at equal *measured* error.

Reproduce (from the repository root)::

    . .venv/bin/activate
    python benchmarks/bench_codecs.py --quick            # about a minute
    python benchmarks/bench_codecs.py                    # full: a few minutes
    python benchmarks/bench_codecs.py --out DIR          # results elsewhere
    python benchmarks/bench_codecs.py --update-results   # rewrite benchmarks/results/

Writes ``DIR/bench_codecs.json`` (every number below, every repeat's time,
every point of the peers' error searches) and ``DIR/bench_codecs.png``
(compression ratio against compression and decompression throughput, and
ratio against measured error, one column per data set); ``DIR`` defaults to
``$TMPDIR/vlcc-bench-results/``; ``--update-results`` writes
``benchmarks/results/`` instead.

Data:

* ``wave-f32``/``wave-f64`` (1024 x 1024): a 2-D acoustic wavefield, the kind
  of state an adjoint seismic code checkpoints: ``u_tt = c^2 lap u`` with
  second-order finite differences in space and time (Alterman & Karal 1968),
  three layers (1500, 2250, 3000 m/s), dx = 5 m, dt = 0.75 ms (Courant 0.45),
  four 15 Hz Ricker sources, 2000 steps (the wavefronts, reflections and
  the layers' head waves fill most of the grid).  Simulated in float64;
  ``wave-f32`` is the same field rounded to float32.
* ``wave3d-f32`` (256^3 float32, 64 MiB; 128^3 with ``--quick``): the same
  equation in 3-D (seven-point Laplacian), dx = 10 m, dt = 1.2 ms (Courant
  0.36), the same three layers along z, eight 12 Hz Ricker sources, one grid
  crossing of the slowest wave.
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
* ``zfpy``: zfpy ``compress_numpy(a, tolerance=t)`` (fixed-accuracy mode);
  ``SZ3``: pysz ``sz.compress`` with ``errorBoundMode = ABS``,
  ``absErrorBound = t``, OpenMP off.  Each twice: ``(stated eb)`` with
  ``t = eb``, and ``(equal error)`` with the ``t`` found by a search such
  that its largest measured error ``max |x - x'|`` is as large as possible
  but not above ours.  ZFP's measured error is usually a fraction of its
  tolerance, so only the second is a fair comparison of ratios; every point
  of the search (tolerance, measured error, ratio) is in the JSON, the
  ratio-against-measured-error curve of each peer.

Protocol.  Every codec runs once untimed (numba compilation or cache load,
allocation of scratch buffers), then ``--repeats`` rounds interleave the
codecs (a, b, c, a, b, c, ...; each round starting one codec later, so no
codec always follows the same one) so that machine load drifts over all of
them alike; each round times one compression and one decompression.  Throughput
is *per core*: uncompressed bytes divided by the thread's CPU time
(``time.thread_time``; all codecs run single-threaded in the calling
thread), so other processes on a shared machine slow the wall clock more
than the figure; the wall-clock medians and the best (least CPU time) repeat
are in the JSON as well.  Medians are reported, and speed-ups are ratios of
medians.  The load average before and after is recorded.

Columns: ``ratio`` = uncompressed / compressed bytes; ``comp``/``decomp``:
median GB/s per core (1 GB = 1e9 bytes, uncompressed); ``max_err/eb``: the
largest ``|x - x'|`` over the data divided by ``eb``; ``ok``: the bound held
(for the peers at equal error: their error did not exceed ours).

``goals`` in the JSON, per data set: our ratio against SZ3's and zfpy's at
equal measured error, our compression speed-up over SZ3 (target 10x), our
decompression speed (target 2 GB/s per core).
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import argparse
import json
import math
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
    c[n // 2 :] = 2250.0
    c[3 * n // 4 :] = 3000.0
    c2 = (c * dt / dx) ** 2
    t = np.arange(nt) * dt
    arg = (np.pi * f0 * (t - 1.2 / f0)) ** 2
    ricker = (1.0 - 2.0 * arg) * np.exp(-arg)
    rng = np.random.default_rng(seed)
    sy = rng.integers(n // 8, 7 * n // 8, 4)
    sx = rng.integers(n // 8, 7 * n // 8, 4)
    return _leapfrog(np.zeros((n, n)), np.zeros((n, n)), c2, nt, sy, sx, ricker)


@numba.njit(cache=True, nogil=True, parallel=True)
def _leapfrog3(u_prev, u, c2, nt, src, wavelet):
    """``nt`` steps of the 3-D scheme (seven-point Laplacian), sources at ``src``."""
    nz, ny, nx = u.shape
    for it in range(nt):
        for i in numba.prange(1, nz - 1):
            for j in range(1, ny - 1):
                for k in range(1, nx - 1):
                    lap = (
                        u[i - 1, j, k]
                        + u[i + 1, j, k]
                        + u[i, j - 1, k]
                        + u[i, j + 1, k]
                        + u[i, j, k - 1]
                        + u[i, j, k + 1]
                        - 6.0 * u[i, j, k]
                    )
                    u_prev[i, j, k] = 2.0 * u[i, j, k] - u_prev[i, j, k] + c2[i] * lap
        for s in range(src.shape[0]):
            u_prev[src[s, 0], src[s, 1], src[s, 2]] += wavelet[it]
        u_prev, u = u, u_prev
    return u


def wavefield3d(n: int = 256, seed: int = 0) -> np.ndarray:
    """The float32 3-D acoustic wavefield described in the module docstring."""
    dx, dt, f0 = 10.0, 1.2e-3, 12.0
    c = np.full(n, 1500.0)
    c[n // 2 :] = 2250.0
    c[3 * n // 4 :] = 3000.0
    c2 = (c * dt / dx) ** 2
    nt = int(n * dx / 1500.0 / dt)
    t = np.arange(nt) * dt
    arg = (np.pi * f0 * (t - 1.2 / f0)) ** 2
    ricker = (1.0 - 2.0 * arg) * np.exp(-arg)
    src = np.random.default_rng(seed).integers(n // 8, 7 * n // 8, (8, 3))
    u = _leapfrog3(np.zeros((n, n, n)), np.zeros((n, n, n)), c2, nt, src, ricker)
    return u.astype(np.float32)


# -- codecs under test -------------------------------------------------------------


class Case:
    """One codec on one array: compress() -> blob, decompress(blob) -> array."""

    def __init__(self, name, family, compress, decompress, bounded, tolerance=None):
        self.name, self.family = name, family
        self.compress, self.decompress, self.bounded = compress, decompress, bounded
        self.tolerance = tolerance  # the bound a peer was given (None: ours, or no bound)


def _zfpy_case(a, tol, label):
    import zfpy

    return Case(
        label,
        "zfp",
        lambda: zfpy.compress_numpy(a, tolerance=tol),
        zfpy.decompress_numpy,
        True,
        tol,
    )


def _sz3_case(a, tol, label):
    import pysz

    cfg = pysz.szConfig(a.shape)
    cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
    cfg.absErrorBound = tol
    cfg.openmp = False
    return Case(
        label,
        "sz3",
        lambda: pysz.sz.compress(a, cfg)[0],
        lambda b: pysz.sz.decompress(b, a.dtype, a.shape)[0],
        True,
        tol,
    )


def _nbytes(blob) -> int:
    return blob.nbytes if isinstance(blob, np.ndarray) else len(blob)


def _max_err(a, y) -> float:
    y = np.asarray(y).reshape(a.shape)
    return float(np.max(np.abs(y.astype(np.float64) - a.astype(np.float64))))


def equal_error_tolerance(a, make, target, steps: int = 9):
    """The largest tolerance ``t`` (to a factor ``2^(2^-steps)``) at which the peer
    made by ``make(t)`` errs at most ``target`` (its largest ``|x - x'|``).

    Brackets ``t`` by doubling / halving from ``target``, then bisects in
    ``log t``.  **Returns** ``(t, points)``, ``points`` every evaluation as
    ``{"tolerance", "max_err", "ratio"}`` (a ratio-against-error curve).
    """
    points = []

    def err(t):
        case = make(t)
        blob = case.compress()
        e = _max_err(a, case.decompress(blob))
        points.append(dict(tolerance=t, max_err=e, ratio=a.nbytes / _nbytes(blob)))
        return e

    lo = hi = target
    while err(lo) > target:
        lo /= 2
        if lo < target * 2.0**-20:
            raise RuntimeError("the peer misses every tolerance down to 1e-6 of the target")
    for _ in range(8):
        hi = lo * 2
        if err(hi) > target:
            break
        lo = hi
    else:
        return lo, points
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if err(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo, points


def make_cases(a: np.ndarray, eb: float, quick: bool, large: bool):
    """The rows for one data set.  **Returns** ``(cases, searches)``."""
    import blosc2

    from vlcc_adjoint.storage.codecs import ErrorBounded, FixedRate, Lossless

    cases = []
    eb_codec = ErrorBounded(eb)
    out = np.empty_like(a)
    cases.append(
        Case(
            "ours ErrorBounded",
            "ours",
            lambda: eb_codec.encode(a),
            lambda b: eb_codec.decode(b, out=out),
            True,
        )
    )
    cases.append(
        Case(
            "ours ErrorBounded (new out)",
            "ours",
            lambda: eb_codec.encode(a),
            lambda b: eb_codec.decode(b),
            True,
        )
    )
    if not large:
        for bits in (8,) if quick else (8, 12):
            fr = FixedRate(bits)
            cases.append(
                Case(
                    f"ours FixedRate({bits})",
                    "ours",
                    lambda fr=fr: fr.encode(a),
                    lambda b, fr=fr: fr.decode(b, out=out),
                    False,
                )
            )
        lossless = Lossless()
        cases.append(
            Case(
                "ours Lossless",
                "ours",
                lambda: lossless.encode(a),
                lambda b: lossless.decode(b, out=out),
                False,
            )
        )
        for label, codec in (("blosc2 lz4", blosc2.Codec.LZ4), ("blosc2 zstd", blosc2.Codec.ZSTD)):

            def comp(codec=codec):
                return blosc2.compress2(
                    a,
                    codec=codec,
                    clevel=5,
                    typesize=a.itemsize,
                    filters=[blosc2.Filter.SHUFFLE],
                    filters_meta=[0],
                    nthreads=1,
                )

            def decomp(b):
                blosc2.decompress2(b, dst=out, nthreads=1)
                return out

            cases.append(Case(label, "blosc2", comp, decomp, False))

    ours_err = _max_err(a, eb_codec.decode(eb_codec.encode(a)))
    searches = {}
    for family, make in (("zfpy", _zfpy_case), ("SZ3", _sz3_case)):
        cases.append(make(a, eb, f"{family} (stated eb)"))
        tol, points = equal_error_tolerance(
            a, lambda t, make=make: make(a, t, ""), ours_err, steps=6 if quick else 9
        )
        searches[family] = dict(target_max_err=ours_err, tolerance=tol, points=points)
        cases.append(make(a, tol, f"{family} (equal error)"))
    return cases, searches


def _timed(fn, *args):
    w0, c0 = time.perf_counter(), time.thread_time()
    result = fn(*args)
    c1, w1 = time.thread_time(), time.perf_counter()
    return result, c1 - c0, w1 - w0


def run_dataset(
    name: str, a: np.ndarray, repeats: int, quick: bool, large: bool = False
) -> tuple[list[dict], dict]:
    eb = 1e-4 * float(a.max() - a.min())
    cases, searches = make_cases(a, eb, quick, large)
    rows = {}
    ours_err = searches["SZ3"]["target_max_err"]
    for case in cases:  # warm-up: compile / load kernels, allocate scratch
        blob = case.compress()
        err = _max_err(a, case.decompress(blob))
        if case.family == "ours" or case.tolerance is None:
            ok = (err <= eb) if case.bounded else None
        elif case.name.endswith("(equal error)"):
            ok = err <= ours_err
        else:
            ok = err <= case.tolerance
        rows[case.name] = dict(
            dataset=name,
            codec=case.name,
            family=case.family,
            dtype=str(a.dtype),
            shape=list(a.shape),
            nbytes=a.nbytes,
            eb=eb,
            tolerance=case.tolerance,
            bounded=case.bounded,
            compressed_nbytes=_nbytes(blob),
            ratio=a.nbytes / _nbytes(blob),
            max_err=err,
            max_err_over_eb=err / eb,
            bound_ok=ok,
            comp_cpu_s=[],
            comp_wall_s=[],
            decomp_cpu_s=[],
            decomp_wall_s=[],
        )
        del blob
    for rep in range(repeats):  # interleaved: a, b, c, b, c, a, c, a, b, ...
        # (each round starts one codec later, so that no codec always runs right
        # after the same one: what a codec leaves behind, freed pages, evicted
        # caches, changes the next one's time by up to ~25% on these VMs)
        for case in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
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
    return list(rows.values()), searches


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'data':<10} {'codec':<28} {'ratio':>7} {'comp':>7} {'decomp':>7} "
        f"{'max_err/eb':>10} {'ok':>4}   (GB/s per core, CPU time)"
    )
    print(head)
    print("-" * len(head))
    last = None
    for r in rows:
        if last is not None and r["dataset"] != last:
            print()
        last = r["dataset"]
        ok = "" if r["bound_ok"] is None else ("yes" if r["bound_ok"] else "NO")
        print(
            f"{r['dataset']:<10} {r['codec']:<28} {r['ratio']:7.2f} {r['comp_GBps']:7.2f} "
            f"{r['decomp_GBps']:7.2f} {r['max_err_over_eb']:10.3g} {ok:>4}"
        )


def goals(rows: list[dict]) -> dict:
    """Per data set: ErrorBounded against SZ3 and zfpy at equal measured error,
    and against the targets (SZ3's ratio, 10x SZ3's compression speed, 2 GB/s
    decompression per core)."""
    result = {}
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        by = {r["codec"]: r for r in rows if r["dataset"] == ds}
        ours, sz3, zfp = by["ours ErrorBounded"], by["SZ3 (equal error)"], by["zfpy (equal error)"]
        comp_vs_sz3 = statistics.median(sz3["comp_cpu_s"]) / statistics.median(ours["comp_cpu_s"])
        decomp_vs_sz3 = statistics.median(sz3["decomp_cpu_s"]) / statistics.median(
            ours["decomp_cpu_s"]
        )
        result[ds] = dict(
            ratio=ours["ratio"],
            max_err=ours["max_err"],
            sz3_ratio=sz3["ratio"],
            sz3_max_err=sz3["max_err"],
            sz3_tolerance=sz3["tolerance"],
            zfpy_ratio=zfp["ratio"],
            zfpy_max_err=zfp["max_err"],
            zfpy_tolerance=zfp["tolerance"],
            ratio_over_sz3=ours["ratio"] / sz3["ratio"],
            ratio_over_zfpy=ours["ratio"] / zfp["ratio"],
            comp_GBps=ours["comp_GBps"],
            decomp_GBps=ours["decomp_GBps"],
            comp_speedup_vs_sz3=comp_vs_sz3,
            decomp_speedup_vs_sz3=decomp_vs_sz3,
            comp_speedup_vs_zfpy=(
                statistics.median(zfp["comp_cpu_s"]) / statistics.median(ours["comp_cpu_s"])
            ),
            ratio_met=ours["ratio"] >= sz3["ratio"],
            comp_speed_met=comp_vs_sz3 >= 10,
            decomp_speed_met=ours["decomp_GBps"] >= 2,
        )
    return result


def summary(g: dict) -> list[str]:
    """One line per data set: the targets, met or missed."""

    def word(ok):
        return "met" if ok else "MISSED"

    return [
        f"{ds}: ratio {v['ratio']:.2f} vs SZ3 {v['sz3_ratio']:.2f} and zfpy "
        f"{v['zfpy_ratio']:.2f} at equal measured error ({word(v['ratio_met'])}); "
        f"compression {v['comp_speedup_vs_sz3']:.1f}x SZ3 "
        f"({word(v['comp_speed_met'])} >= 10x); decompression "
        f"{v['decomp_GBps']:.2f} GB/s per core ({word(v['decomp_speed_met'])} >= 2)"
        for ds, v in g.items()
    ]


def plot(rows: list[dict], searches: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(3, len(datasets), figsize=(4.6 * len(datasets), 12.5), squeeze=False)
    colors = {"ours": "tab:red", "blosc2": "tab:gray", "zfp": "tab:blue", "sz3": "tab:green"}
    markers = {
        "ours ErrorBounded": "*",
        "ours ErrorBounded (new out)": "P",
        "ours Lossless": "s",
        "blosc2 lz4": "s",
        "blosc2 zstd": "D",
        "zfpy (stated eb)": "o",
        "zfpy (equal error)": "o",
        "SZ3 (stated eb)": "^",
        "SZ3 (equal error)": "^",
    }
    for col, ds in enumerate(datasets):
        for row, key in enumerate(("comp", "decomp")):
            ax = axes[row][col]
            for r in (r for r in rows if r["dataset"] == ds):
                hollow = r["codec"].endswith("(stated eb)")
                ax.scatter(
                    r[f"{key}_GBps"],
                    r["ratio"],
                    s=90,
                    marker=markers.get(r["codec"], "v"),
                    label=r["codec"],
                    facecolors="none" if hollow else colors[r["family"]],
                    edgecolors=colors[r["family"]],
                )
                below = r["codec"].endswith("(new out)") or r["codec"].endswith("(stated eb)")
                ax.annotate(
                    r["codec"].replace("ours ", ""),
                    (r[f"{key}_GBps"], r["ratio"]),
                    fontsize=7,
                    xytext=(4, -9 if below else 3),
                    textcoords="offset points",
                )
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
        ax = axes[2][col]  # ratio against measured error: the peers' search curves
        eb = next(r["eb"] for r in rows if r["dataset"] == ds)
        for family, color in (("zfpy", "tab:blue"), ("SZ3", "tab:green")):
            pts = sorted(searches[ds][family]["points"], key=lambda p: p["max_err"])
            ax.plot(
                [p["max_err"] / eb for p in pts],
                [p["ratio"] for p in pts],
                "o-",
                ms=3,
                color=color,
                label=family,
            )
        ours = next(r for r in rows if r["dataset"] == ds and r["codec"] == "ours ErrorBounded")
        ax.scatter(
            ours["max_err_over_eb"],
            ours["ratio"],
            s=120,
            marker="*",
            color="tab:red",
            label="ours ErrorBounded",
            zorder=3,
        )
        ax.axvline(ours["max_err_over_eb"], color="tab:red", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("measured max |x - x'| / eb")
        ax.set_ylabel("compression ratio")
        ax.set_title(f"{ds}: ratio against measured error", fontsize=10)
        ax.legend(fontsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and configurations")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5/25)")
    parser.add_argument(
        "--out",
        type=Path,
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write benchmarks/results/ (the tracked results) instead of --out",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 25)
    out_dir = HERE / "results" if args.update_results else Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    import blosc2
    import pysz  # noqa: F401
    import zfpy

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    u64 = wavefield()
    u3 = wavefield3d(128 if args.quick else 256)
    t_sim = time.perf_counter() - t0
    datasets = {
        "wave-f32": u64.astype(np.float32),
        "wave-f64": u64,
        "noise-f32": np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32),
        "wave3d-f32": u3,
    }
    print(f"wavefields simulated in {t_sim:.1f} s; load average {load_before}")
    rows, searches = [], {}
    for name, a in datasets.items():
        large = a.nbytes > 32 << 20
        got, searches[name] = run_dataset(
            name, a, max(5, repeats // 3) if large else repeats, args.quick, large
        )
        rows.extend(got)
    load_after = os.getloadavg()
    print_table(rows)
    print()
    g = goals(rows)
    lines = summary(g)
    for line in lines:
        print(line)
    print(f"load average before {load_before}, after {load_after}; {os.cpu_count()} CPUs")

    meta = dict(
        quick=args.quick,
        repeats=repeats,
        load_before=load_before,
        load_after=load_after,
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        processor=platform.processor(),
        python=platform.python_version(),
        numpy=np.__version__,
        numba=numba.__version__,
        blosc2=blosc2.__version__,
        zfpy=getattr(zfpy, "__version__", "1.0.1"),
        simulate_s=t_sim,
        summary=lines,
        seconds=time.perf_counter() - t0,
    )
    with open(out_dir / "bench_codecs.json", "w") as f:
        json.dump(dict(meta=meta, goals=g, rows=rows, searches=searches), f, indent=1)
    plot(rows, searches, out_dir / "bench_codecs.png")
    print(
        f"wrote {out_dir / 'bench_codecs.json'} and {out_dir / 'bench_codecs.png'} "
        f"in {meta['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
