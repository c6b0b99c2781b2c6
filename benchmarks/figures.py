"""Draw the figures of the benchmarks that write only JSON.

Reproduce::

    . .venv/bin/activate
    python benchmarks/figures.py                      # every figure whose JSON exists
    python benchmarks/figures.py --only tiers torch   # some of them
    python benchmarks/figures.py --results DIR        # JSONs in DIR, PNGs next to them
    python benchmarks/figures.py --update-results     # redraw benchmarks/results/*.png

Without ``--results`` it reads the tracked ``benchmarks/results/`` and, unless
``--update-results`` is given, writes the PNGs to ``$TMPDIR/vlcc-bench-results/``.

``bench_tiers``, ``bench_overlap``, ``bench_lineage``, ``bench_torch`` and
``bench_multistage`` measure and write ``results/bench_<name>.json``; this
module turns each JSON into ``results/bench_<name>.png``, so a figure can be
redrawn (or restyled) without rerunning a benchmark that takes minutes.
``benchmarks/run_all.py`` calls :func:`draw` after each of them.

Every panel puts the peer tool next to ours, in the colours of
``bench_seismic.png``: ours in blue, peers in grey (darker grey for the
second peer), floors that no store can beat (a bare copy, a file rewrite,
compute alone) light and hatched.  Bars are medians over the benchmark's
repeats, whiskers span min-max, dots are the single repeats, wherever the
JSON keeps them.  The footer of each figure names the command that
reproduces its data (``--quick`` when the JSON says so).

Both the ``--quick`` and the full forms of every JSON are drawn: the
figures take their sizes, methods, segment counts and repeats from the
data, never from a list of what the full run has.  A missing JSON is
skipped; a JSON that cannot be read, or that lacks a field a figure needs,
raises :class:`ResultError` naming the file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

KIB, MIB = 1 << 10, 1 << 20

# The palette of bench_seismic.png: ours blue, peers grey.
OURS, OURS_ALT, OURS_DARK = "#1f77b4", "#6baed6", "#08519c"
PEER, PEER_DARK = "#999999", "#555555"
FLOOR = "#dddddd"
#: repeats drawn one dot each; beyond this many a bar keeps only its whisker
MAX_DOTS = 40

__all__ = ["FIGURES", "ResultError", "default_out", "draw", "draw_all", "main"]


def default_out() -> Path:
    """Where benchmark runs write unless told otherwise: ``$TMPDIR/vlcc-bench-results``
    (``/tmp`` without ``TMPDIR``), outside the source tree, so that no run
    rewrites the tracked ``benchmarks/results/`` by accident."""
    return Path(os.environ.get("TMPDIR") or "/tmp") / "vlcc-bench-results"


class ResultError(ValueError):
    """A benchmark's JSON could not be read or lacks what its figure needs."""


# -- small drawing helpers ---------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _span(median: float, samples) -> tuple[float, float]:
    """Whisker lengths below and above `median` for min-max of `samples`."""
    samples = [s for s in samples if s is not None and math.isfinite(s)]
    if not samples:
        return 0.0, 0.0
    return max(median - min(samples), 0.0), max(max(samples) - median, 0.0)


def _style(method: str, palette: dict) -> dict:
    """Bar keyword arguments for `method`: its colour, a hatch for floors."""
    color = palette.get(method, PEER)
    style = {"color": color, "edgecolor": "black", "linewidth": 0.4}
    if color == FLOOR:
        style["hatch"] = "//"
    return style


def _grouped_bars(
    ax, groups: list[str], methods: list[str], value, samples, palette, *, label_fmt=None, log=False
):
    """Bars of `methods` side by side in each of `groups`.

    `value(group, method)` is the median (None: absent), `samples(group,
    method)` the repeats for the whisker and dots, `label_fmt(group,
    method)` an optional text over the bar.
    """
    width = 0.8 / max(len(methods), 1)
    for j, method in enumerate(methods):
        xs, ys, lo, hi = [], [], [], []
        for i, group in enumerate(groups):
            v = value(group, method)
            if v is None:
                continue
            x = i - 0.4 + (j + 0.5) * width
            reps = samples(group, method) or []
            down, up = _span(v, reps)
            xs.append(x)
            ys.append(v)
            lo.append(down)
            hi.append(up)
            if 1 < len(reps) <= MAX_DOTS:
                ax.plot([x] * len(reps), reps, "k.", ms=2, zorder=3)
            text = label_fmt(group, method) if label_fmt else None
            if text:
                ax.annotate(
                    text,
                    (x, v + up),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    rotation=90,
                )
        if xs:
            ax.bar(
                xs,
                ys,
                width * 0.92,
                yerr=[lo, hi],
                capsize=2,
                label=method,
                error_kw={"elinewidth": 0.8},
                **_style(method, palette),
            )
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    if log:
        ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_axisbelow(True)


def _headroom(ax, factor: float = 1.25, log: bool = False):
    """Room above the tallest bar for the labels over it."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (factor**3 if log else factor))


def _footer(fig, command: str, detail: str = ""):
    text = f"reproduce: {command}"
    if detail:
        text += f"   |   {detail}"
    fig.text(
        0.5, 0.003, text, ha="center", va="bottom", fontsize=8, family="monospace", color="#333333"
    )


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _size(nbytes: float) -> str:
    if nbytes >= MIB:
        return f"{nbytes / MIB:g} MiB"
    return f"{nbytes / KIB:g} KiB"


def _ordered(present, preferred) -> list:
    """`preferred` first (those present), then the others in their order."""
    present = list(dict.fromkeys(present))
    return [m for m in preferred if m in present] + [m for m in present if m not in preferred]


# -- bench_tiers -------------------------------------------------------------------------

_TIER_PALETTE = {
    # capture: ours (the pool) against numpy's ways of copying
    "pool": OURS,
    "reused": FLOOR,
    "fresh dst": PEER,
    "np.copy": PEER_DARK,
    # writes: ZarrTier against a plain file write and zarr's own API
    "plain": PEER,
    "plain rewrite": FLOOR,
    "zarr-tier": OURS,
    "zarr-tier fresh": OURS_ALT,
    "zarr API": PEER_DARK,
    # reads
    "plain read": PEER,
    "get": OURS,
}
_TIER_READS = ("plain read", "get")
# (d): the durable disk-rate sections and their labels
_TIER_DISK = {
    "burst": "burst",
    "burst_cold": "burst,\nmemory as found",
    "single": "single\nrecord",
    "read": "read, not\nin page cache",
}
_DISK_PALETTE = {
    "dd": PEER,
    "dd, bs=record": PEER_DARK,
    "store": OURS,
    "store, 1 writer": OURS_ALT,
    "put": OURS_DARK,
    "readinto": PEER_DARK,
    "readinto, reused": PEER,
    "readinto, page cache": FLOOR,
}


def _draw_disk(ax, d: dict, keys: list) -> None:
    """(d): MB/s of each method per section, labelled with its paired ratio to dd."""
    groups = [_TIER_DISK[k] for k in keys]
    key = dict(zip(groups, keys))
    methods = _ordered((m for k in keys for m in d[k]["MB_per_s"]), list(_DISK_PALETTE))

    def nbytes(sec):
        return sec["record_bytes"] * sec["count"]

    def value(g, m):
        return d[key[g]]["MB_per_s"].get(m)

    def samples(g, m):
        sec = d[key[g]]
        return [nbytes(sec) / t / 1e6 for t in sec["seconds"].get(m, []) if t > 0]

    def ratio(g, m):
        r = d[key[g]]["vs_dd"].get(m)
        return None if r is None or m == "dd" else f"{r['median']:.2f}x"

    _grouped_bars(ax, groups, methods, value, samples, _DISK_PALETTE, label_fmt=ratio)
    _headroom(ax, 1.25)
    ax.set_ylabel("MB/s (higher is better)")
    sec = d[keys[0]]
    ax.set_title(
        f"(d) durable writes, cold reads: {sec['count']} x {_size(sec['record_bytes'])}"
        " records vs dd\nlabel: rate / dd's rate, paired by round",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)


def _draw_tiers(d: dict, path: Path) -> Path:
    plt = _pyplot()
    capture, tiers = d["capture"], d["tiers"]
    disk = [k for k in _TIER_DISK if k in d]
    ratios = [2, 4, 2.4] + ([3.2] if disk else [])
    fig, axes = plt.subplots(
        1, len(ratios), figsize=(17 + 6 * bool(disk), 5.2), gridspec_kw={"width_ratios": ratios}
    )

    def gbs(nbytes, times):
        return [nbytes / t / 1e9 for t in times if t > 0]

    # (a) capture bandwidth.
    ax = axes[0]
    sizes = sorted({r["n"] for r in capture})
    by = {(r["n"], r["method"]): r for r in capture}
    methods = _ordered((r["method"] for r in capture), ["pool", "reused", "fresh dst", "np.copy"])
    groups = [
        f"{n}² float64\n{_size(by[n, next(m for m in methods if (n, m) in by)]['bytes'])}"
        for n in sizes
    ]
    key = dict(zip(groups, sizes))
    _grouped_bars(
        ax,
        groups,
        methods,
        lambda g, m: by[key[g], m]["GB_s"] if (key[g], m) in by else None,
        lambda g, m: (
            gbs(by[key[g], m]["bytes"], by[key[g], m].get("times_s", []))
            if (key[g], m) in by
            else None
        ),
        _TIER_PALETTE,
    )
    ax.set_ylabel("capture bandwidth, GB/s (higher is better)")
    ax.set_title("(a) capture: pooled buffer (ours) vs numpy copies", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    _headroom(ax, 1.1)

    # (b) writes, (c) reads: GB/s per leaf size, paired ratio to the plain file op.
    by = {(r["bytes"], r["method"]): r for r in tiers}
    sizes = sorted({r["bytes"] for r in tiers})
    groups = [_size(b) for b in sizes]
    key = dict(zip(groups, sizes))
    all_methods = [r["method"] for r in tiers]
    writes = _ordered(
        (m for m in all_methods if m not in _TIER_READS),
        ["plain", "plain rewrite", "zarr-tier", "zarr-tier fresh", "zarr API"],
    )
    reads = _ordered((m for m in all_methods if m in _TIER_READS), list(_TIER_READS))

    def value(g, m):
        return by[key[g], m]["GB_s"] if (key[g], m) in by else None

    def samples(g, m):
        r = by.get((key[g], m))
        return gbs(r["bytes"], r.get("times_s", [])) if r else None

    def ratio(g, m):
        r = by.get((key[g], m))
        if r is None or m in ("plain", "plain read"):
            return None
        return f"{r.get('paired_ratio', r.get('ratio_to_plain', float('nan'))):.2f}x"

    for ax, methods, what in ((axes[1], writes, "write"), (axes[2], reads, "read")):
        if not methods:
            ax.set_visible(False)
            continue
        _grouped_bars(ax, groups, methods, value, samples, _TIER_PALETTE, label_fmt=ratio, log=True)
        _headroom(ax, 1.6, log=True)
        ax.set_xlabel("one float64 leaf of")
        ax.set_ylabel(f"{what} bandwidth, GB/s (log; higher is better)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(methods))
    axes[1].set_title(
        "(b) tier writes: ZarrTier (ours) vs plain file write and zarr API\n"
        "label: time / plain's time, paired by round",
        fontsize=10,
    )
    axes[2].set_title(
        "(c) tier reads: ZarrTier.get (ours) vs plain read\n"
        "label: time / plain read's time, paired",
        fontsize=10,
    )
    if disk:
        _draw_disk(axes[3], d, disk)
    m = d.get("machine", {})
    fs = m.get("filesystem", {})
    fig.suptitle(
        "bench_tiers: capture copies and tier I/O (a-c: page cache, no fsync; d: durable) "
        "(bar: median, whisker: min-max, dots: repeats)",
        fontsize=11,
    )
    _footer(
        fig,
        "python benchmarks/bench_tiers.py" + (" --quick" if d.get("quick") else ""),
        f"{m.get('cpus', '?')} CPUs, {fs.get('type', '?')} on {fs.get('mount', '?')}, "
        f"zarr {m.get('zarr', '?')}",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, path)


# -- bench_overlap -----------------------------------------------------------------------

_OVERLAP_PALETTE = {
    "compute": FLOOR,
    "copy only": FLOOR,
    "zarr API": PEER_DARK,
    "sync": OURS_ALT,
    "async": OURS,
    "async w2": OURS_DARK,
    "sync fsync": OURS_ALT,
    "async fsync": OURS,
    "prefetch off": OURS_ALT,
    "prefetch on": OURS,
}


def _hbars(ax, modes, med, runs, key, palette, *, stall_key=None, notes=None):
    """Horizontal bars of med[mode][key], whiskers and dots over runs[mode];
    the caller-blocked part (`stall_key`) drawn inside as a dark inset."""
    y = list(range(len(modes)))
    vals = [med[m][key] for m in modes]
    reps = [[r[key] for r in runs.get(m, []) if r.get(key) is not None] for m in modes]
    spans = [_span(v, r) for v, r in zip(vals, reps)]
    for i, m in enumerate(modes):
        ax.barh(
            i, vals[i], 0.7, xerr=[[spans[i][0]], [spans[i][1]]], capsize=3, **_style(m, palette)
        )
        if 1 < len(reps[i]) <= MAX_DOTS:
            ax.plot(reps[i], [i] * len(reps[i]), "k.", ms=3, zorder=3)
        stall = med[m].get(stall_key) if stall_key else None
        if stall is not None:
            ax.barh(
                i,
                stall,
                0.28,
                color="#d62728",
                zorder=2,
                label="caller blocked (stall_s)"
                if i == next(k for k, mm in enumerate(modes) if med[mm].get(stall_key) is not None)
                else None,
            )
        if notes and notes.get(m):
            ax.text(vals[i] + spans[i][1], i, "  " + notes[m], va="center", fontsize=7)
    ax.set_yticks(y, modes, fontsize=8)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _draw_overlap(d: dict, path: Path) -> Path:
    plt = _pyplot()
    args = d.get("args", {})
    fwd, bwd = d["forward"], d["backward"]
    fmed, fruns = fwd["medians"], fwd.get("runs", {})
    bmed, bruns = bwd["medians"], bwd.get("runs", {})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(16, 5.4), gridspec_kw={"width_ratios": [3, 2]})

    # (a) forward: wall time of the whole run, sync vs async capture, against compute alone.
    modes = _ordered(
        fmed,
        [
            "compute",
            "copy only",
            "zarr API",
            "sync",
            "async",
            "async w2",
            "sync fsync",
            "async fsync",
        ],
    )
    compute = fmed.get("compute", {}).get("total_s")
    notes = {}
    for m in modes:
        t = fmed[m]["total_s"]
        parts = []
        if compute and m != "compute":
            parts.append(f"{t / compute:.2f}x compute")
        base = fmed.get("sync fsync" if m.endswith("fsync") else "sync", {}).get("total_s")
        if m.startswith("async") and base and compute and base > compute:
            parts.append(f"hidden {(base - t) / (base - compute):.0%} of sync's I/O")
        notes[m] = ", ".join(parts)
    _hbars(ax, modes, fmed, fruns, "total_s", _OVERLAP_PALETTE, stall_key="stall_s", notes=notes)
    if compute:
        ax.axvline(compute, color="black", ls=":", lw=1, label="compute only (median)")
    ax.set_xlabel("seconds for the forward run incl. final flush (median; whisker min-max)")
    n = args.get("n", "?")
    saves = (args["steps"] // args["every"] + 1) if "steps" in args and "every" in args else "?"
    state = f"{2 * n * n * 8 / MIB:.0f} MiB" if isinstance(n, int) else "?"
    ax.set_title(
        f"(a) forward: {args.get('steps', '?')} steps of a {n}² wave equation, "
        f"{saves} saves of {state} to a ZarrTier\n"
        "sync vs async capture (ours) vs zarr API writes (peer), against compute alone",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.35)

    # (b) backward: prefetch off vs on.
    modes = _ordered(bmed, ["prefetch off", "prefetch on"])
    notes = {
        m: f"{bmed[m].get('hits', 0):.0f} hits / {bmed[m].get('misses', 0):.0f} misses, "
        f"cache {bmed[m].get('peak_cache_MiB', 0):.0f} MiB"
        for m in modes
    }
    _hbars(bx, modes, bmed, bruns, "total_s", _OVERLAP_PALETTE, stall_key="stall_s", notes=notes)
    # Compute alone in the backward pass: the adjoint sweeps, from the forward step time.
    step = d.get("step_seconds")
    if step and "back" in args and "adjoint" in args:
        floor = (args["back"] - 1) * args["adjoint"] * step
        bx.axvline(
            floor,
            color="black",
            ls=":",
            lw=1,
            label=f"adjoint compute alone (~{floor:.2f} s, from the step time)",
        )
    bx.set_xlabel("seconds for the backward pass (median; whisker min-max)")
    cache = args.get("cache", "?")
    loads = args["back"] - 1 if isinstance(args.get("back"), int) else "?"
    bx.set_title(
        f"(b) backward: {loads} loads of {state} "
        f"({'warm' if args.get('warm') else 'cold'} page cache), "
        f"{args.get('adjoint', '?')} sweeps / adjoint step\n"
        f"prefetch off vs on ({cache} states of cache, the schedule's io_plan)",
        fontsize=10,
    )
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    bx.set_xlim(0, bx.get_xlim()[1] * 1.6)

    m = d.get("machine", {})
    load = d.get("loadavg_before") or ["?"]
    fig.suptitle(
        "bench_overlap: checkpoint I/O behind computation (bar: median total, "
        "red inset: time the caller was blocked in the store, dots: repeats)",
        fontsize=11,
    )
    _footer(
        fig,
        "python benchmarks/bench_overlap.py" + (" --quick" if args.get("quick") else ""),
        f"{args.get('repeats', '?')} repeats, {m.get('cpus', '?')} CPUs"
        + (f", load {load[0]:.1f} before" if isinstance(load[0], (int, float)) else ""),
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, path)


# -- bench_lineage -----------------------------------------------------------------------

_LINEAGE_PALETTE = {
    "lineage": OURS,
    "lineage copy": OURS_ALT,
    "lineage lz4": OURS_DARK,
    "np.save": PEER,
    "torch.save": PEER_DARK,
}


def _draw_lineage(d: dict, path: Path) -> Path:
    plt = _pyplot()
    mb = d["state_bytes"] / 1e6
    frac = d.get("changed_chunk_fraction", 0.05)
    workloads = [
        (
            f"(a) {d['versions']} versions,\n{frac:.0%} of chunks change",
            d["summary"],
            d.get("runs", {}),
        )
    ]
    if "all_changed" in d:
        w = d["all_changed"]
        workloads.append(
            (f"(b) {w['versions']} versions,\nevery chunk changes", w["summary"], w.get("runs", {}))
        )
    if "all_changed_with_computation" in d:
        w = d["all_changed_with_computation"]
        workloads.append(
            (
                f"(c) as (b), {w.get('gap_s', '?')} s of\ncompute between versions",
                w["summary"],
                w.get("runs", {}),
            )
        )
    groups = [w[0] for w in workloads]
    by = {w[0]: w for w in workloads}
    methods = _ordered((m for w in workloads for m in w[1]), list(_LINEAGE_PALETTE))

    def value(key, scale=1.0):
        def f(g, m):
            s = by[g][1].get(m)
            return None if s is None or s.get(key) is None else s[key] * scale

        return f

    def samples(key, scale=1.0):
        def f(g, m):
            return [r[key] * scale for r in by[g][2].get(m, []) if r.get(key) is not None]

        return f

    def vs_npsave(key):
        def f(g, m):
            s = by[g][1].get(m)
            if s is None or m == "np.save" or s.get(key) is None:
                return None
            return f"{s[key]:.2f}x"

        return f

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.4))
    ax = axes[0]
    _grouped_bars(
        ax,
        groups,
        methods,
        value("blocked_s", 1e3),
        samples("blocked_s", 1e3),
        _LINEAGE_PALETTE,
        label_fmt=vs_npsave("blocked_vs_npsave"),
    )
    _headroom(ax, 1.2)
    ax.set_ylabel("caller-blocked time per version, ms (lower is better)")
    ax.set_title("blocked time per commit (versions 2..N)\nlabel: / np.save's, paired", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")

    ax = axes[1]
    _grouped_bars(
        ax,
        groups,
        methods,
        value("storage_x"),
        samples("storage_x"),
        _LINEAGE_PALETTE,
        label_fmt=lambda g, m: f"{by[g][1][m]['storage_x']:.2f}x" if m in by[g][1] else None,
    )
    target = d.get("targets", {}).get("storage_at_most_2.5x")
    if target is not None:
        (line,) = ax.plot([-0.45, 0.45], [2.5, 2.5], color="#d62728", ls="--", lw=1)
        ax.legend([line], ["target for (a): <= 2.5x"], fontsize=7, loc="upper right")
    _headroom(ax, 1.15)
    ax.set_ylabel("bytes on disk / one version's bytes (lower is better)")
    ax.set_title("storage after all versions", fontsize=10)

    ax = axes[2]
    _grouped_bars(
        ax,
        groups,
        methods,
        value("throughput_GB_s"),
        samples("throughput_GB_s"),
        _LINEAGE_PALETTE,
        label_fmt=vs_npsave("throughput_vs_npsave"),
    )
    _headroom(ax, 1.2)
    ax.set_ylabel("GB of state committed / s, until durable (higher is better)")
    ax.set_title(
        "end-to-end throughput (History.wait() included)\nlabel: / np.save's, paired", fontsize=10
    )

    m = d.get("machine", {})
    peers = " / ".join(m for m in methods if not m.startswith("lineage"))
    fig.suptitle(
        f"bench_lineage: versioned History (ours, blue) vs {peers} (grey), "
        f"{mb:.0f} MB state, back to back (bar: median over {d.get('repeats', '?')} "
        "repeats, whisker: min-max, dots: repeats)",
        fontsize=11,
    )
    load = m.get("load_avg") or [None]
    _footer(
        fig,
        "python benchmarks/bench_lineage.py" + (" --quick" if d.get("quick") else ""),
        f"{m.get('cpus', '?')} CPUs"
        + (f", load {load[0]:.1f}" if isinstance(load[0], (int, float)) else "")
        + ("" if d.get("torch", True) else "; torch not installed: no torch.save"),
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, path)


# -- bench_torch -------------------------------------------------------------------------

_TORCH_KINDS = {
    # kind: (label, colour, marker)
    "plain": ("plain autograd (keeps every step)", "black", "s"),
    "ckpt_seq": ("checkpoint_sequential, use_reentrant=False", PEER, "o"),
    "ckpt_seq_reentrant": ("checkpoint_sequential, use_reentrant=True", PEER_DARK, "^"),
    "vlcc": ("vlcc checkpoint_sequence (ours)", OURS, "*"),
}
_TORCH_B_PALETTE = {
    "torch.save": PEER,
    "dcp.save": PEER_DARK,
    "dcp.async_save": PEER_DARK,
    "vlcc copy": OURS_ALT,
    "vlcc deferred": OURS,
    "vlcc deferred +disk": OURS_DARK,
}


def _draw_torch_a(ax, a: dict):
    n = a["n"]
    seen = set()
    for r in a["rows"]:
        label, color, marker = _TORCH_KINDS.get(r["kind"], (r["kind"], "tab:purple", "D"))
        down, up = _span(r["seconds"], r.get("repeats", []))
        ax.errorbar(
            r["peak_states"],
            r["seconds"],
            yerr=[[down], [up]],
            fmt=marker,
            color=color,
            mec="black",
            mew=0.5,
            ms=12 if marker == "*" else 7,
            capsize=3,
            ecolor=color,
            label=None if r["kind"] in seen else label,
            zorder=3 if r["kind"] == "vlcc" else 4,
        )  # peers stay visible on ours
        seen.add(r["kind"])
        if r["kind"] in ("vlcc", "plain"):
            ax.annotate(
                r["name"].replace("vlcc ", ""),
                (r["peak_states"], r["seconds"] + up),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=OURS if r["kind"] == "vlcc" else "black",
            )
    # checkpoint_sequential at the same segment count: join the two modes and ours.
    by = {r["name"]: r for r in a["rows"]}
    for r in a["rows"]:
        if r["kind"] == "vlcc" and "vs" in r:
            mates = [by.get(f"ckpt_seq s={r['vs']}"), by.get(f"ckpt_seq s={r['vs']} reentrant")]
            pts = [p for p in mates if p] + [r]
            ax.plot(
                [p["peak_states"] for p in pts],
                [p["seconds"] for p in pts],
                color="#bbbbbb",
                lw=0.8,
                ls="--",
                zorder=1,
            )
    plain = by.get("plain")
    if plain:
        ax.axhline(plain["seconds"], color="black", ls=":", lw=0.8)
    floor = 2 * math.sqrt(n)
    ax.axvline(
        floor,
        color="#d62728",
        ls="--",
        lw=0.8,
        label=f"2 sqrt(n) = {floor:.0f} states: checkpoint_sequential's floor",
    )
    ax.set_xscale("log")
    ax.set_xlabel(
        "peak activation memory, states of 32 KiB (measured, log)"
        if a.get("state_bytes") == 32768
        else "peak activation memory, in states (measured, log)"
    )
    ax.set_ylabel("thread CPU seconds per forward + backward (median; whisker min-max)")
    rnn = a.get("rnn", {})
    ax.set_title(
        f"(a) RNNCell chain, n = {n} steps (hidden {rnn.get('hidden', '?')}, "
        f"batch {rnn.get('batch', '?')}): time vs memory\n"
        "dashed grey: the same memory budget, ours vs both checkpoint_sequential modes",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def _draw_torch_b(bx, b: dict):
    rows = b["rows"]
    y = list(range(len(rows)))
    for i, r in enumerate(rows):
        reps = r.get("repeats", {})
        down, up = _span(r["blocked"], reps.get("blocked", []))
        style = _style(r["method"], _TORCH_B_PALETTE)
        call = min(r.get("call", r["blocked"]), r["blocked"])
        bx.barh(i, call, 0.7, **style, label="in the checkpoint call" if i == 0 else None)
        bx.barh(
            i,
            r["blocked"] - call,
            0.7,
            left=call,
            color=style["color"],
            alpha=0.5,
            hatch="xx",
            edgecolor="black",
            linewidth=0.4,
            label="waiting before the next optimizer step" if i == 0 else None,
        )
        bx.errorbar(r["blocked"], i, xerr=[[down], [up]], fmt="none", ecolor="black", capsize=3)
        if len(reps.get("blocked", [])) > 1:
            bx.plot(reps["blocked"], [i] * len(reps["blocked"]), "k.", ms=3, zorder=3)
        if r.get("write") is not None:
            bx.plot(
                r["write"],
                i,
                marker="|",
                color="#d62728",
                ms=14,
                mew=2,
                label="data in the page cache (write s)" if i == 0 else None,
            )
        ratio = r.get("vs_torch_save")
        text = f"  {r['blocked']:.3f} s" + (
            f" ({ratio:.2f}x torch.save)"
            if ratio is not None and r["method"] != "torch.save"
            else ""
        )
        bx.text(max(r["blocked"] + up, r.get("write") or 0), i, text, va="center", fontsize=7)
    step = b.get("train_step_seconds")
    if step:
        bx.axvline(step, color="black", ls=":", lw=1, label=f"one training step ({step:.2f} s)")
    bx.set_yticks(y, [r["method"] for r in rows], fontsize=8)
    bx.invert_yaxis()
    bx.set_xlim(0, bx.get_xlim()[1] * 1.45)
    bx.set_xlabel("seconds the training loop is blocked per checkpoint (median; whisker min-max)")
    state = b.get("state_bytes", 0) / MIB
    bx.set_title(
        f"(b) training-state checkpoint: MLP {b.get('layers', '?')} x "
        f"{b.get('width', '?')}² + AdamW, {state:.0f} MiB of state\n"
        "ours (DeepSpeed checkpoint engine) vs torch.save and "
        "torch.distributed.checkpoint",
        fontsize=10,
    )
    bx.grid(True, axis="x", alpha=0.3)
    bx.set_axisbelow(True)
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)


def _draw_torch(d: dict, path: Path) -> Path:
    plt = _pyplot()
    parts = [p for p in ("a", "b") if p in d]
    if not parts:
        raise KeyError("neither part 'a' nor part 'b'")
    fig, axes = plt.subplots(1, len(parts), figsize=(8.5 * len(parts), 6), squeeze=False)
    for ax, part in zip(axes[0], parts):
        (_draw_torch_a if part == "a" else _draw_torch_b)(ax, d[part])
    meta = d.get("meta", {})
    fig.suptitle(
        f"bench_torch: vlcc_adjoint.torch vs PyTorch's own checkpointing "
        f"(torch {meta.get('torch', '?')}, {meta.get('threads', '?')} thread; "
        "whiskers: min-max over repeats)",
        fontsize=11,
    )
    cmd = "python benchmarks/bench_torch.py" + (" --quick" if meta.get("quick") else "")
    if parts != ["a", "b"]:
        cmd += f" --part {parts[0]}"
    load = meta.get("loadavg_before") or [None]
    _footer(
        fig,
        cmd,
        f"{meta.get('cpus', '?')} CPUs"
        + (f", load {load[0]:.1f} before" if isinstance(load[0], (int, float)) else ""),
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, path)


# -- bench_multistage --------------------------------------------------------------------


def _multistage_configs() -> dict:
    """``bench_multistage.CONFIGS`` (what A and B are), or {} if it cannot be imported."""
    try:
        sys.path.insert(0, str(HERE))
        from bench_multistage import CONFIGS
    except Exception:  # the figure only loses its config description
        return {}
    finally:
        sys.path.remove(str(HERE))
    return CONFIGS


def _draw_multistage(d: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = d["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    described = _multistage_configs()
    only_new = all(r.get("old") is None and r.get("old_predicted_cpu") is None for r in rows)
    fig, axes = plt.subplots(1, len(configs), figsize=(6.5 * len(configs), 5.2), squeeze=False)
    styles = {
        "old": dict(
            color=PEER_DARK,
            ls="--",
            marker="s",
            label=f"old (git {Path(d.get('old', '')).stem.rsplit('_', 1)[-1]})",
        ),
        "new": dict(color=OURS, ls="-", marker="o", label="new (current module)"),
    }
    for ax, cfg in zip(axes[0], configs):
        mine = sorted((r for r in rows if r["config"] == cfg), key=lambda r: r["n"])
        for which in ("old", "new"):
            pts = [(r["n"], r[which]) for r in mine if r.get(which)]
            if not pts:
                continue
            ns = [n for n, _ in pts]
            cpu = [m["cpu"] for _, m in pts]
            err = [_span(m["cpu"], [x["cpu"] for x in m.get("runs", [])]) for _, m in pts]
            ax.errorbar(
                ns,
                cpu,
                yerr=[[e[0] for e in err], [e[1] for e in err]],
                capsize=3,
                ms=6,
                **styles[which],
            )
        # Old runs not made: predicted (power law through the last two sizes) or killed.
        last_old = [(r["n"], r["old"]["cpu"]) for r in mine if r.get("old")]
        for r in mine:
            if r.get("old") or only_new:
                continue
            pred = r.get("old_predicted_cpu")
            if pred:
                if last_old:
                    ax.plot(
                        [last_old[-1][0], r["n"]],
                        [last_old[-1][1], pred],
                        color=PEER_DARK,
                        ls=":",
                        lw=1,
                    )
                ax.plot(
                    r["n"],
                    pred,
                    marker="s",
                    mfc="white",
                    mec=PEER_DARK,
                    ms=7,
                    ls="none",
                    label="old, predicted (not run: over the cap)",
                )
                ax.annotate(
                    f"~{pred:,.0f} s",
                    (r["n"], pred),
                    xytext=(-6, 0),
                    textcoords="offset points",
                    ha="right",
                    va="center",
                    fontsize=7,
                )
            else:
                ax.plot(
                    r["n"],
                    r.get("cap", 0),
                    marker="^",
                    color=PEER_DARK,
                    ms=7,
                    ls="none",
                    label=f"old, killed at the cap ({r.get('cap', 0):.0f} s)",
                )
        # Speed-up where both ran.
        for r in mine:
            if r.get("old") and r.get("new") and r["new"]["cpu"] > 0:
                ax.annotate(
                    f"{r['old']['cpu'] / r['new']['cpu']:.0f}x",
                    (r["n"], math.sqrt(r["old"]["cpu"] * r["new"]["cpu"])),
                    xytext=(5, 0),
                    textcoords="offset points",
                    fontsize=8,
                    va="center",
                )
            elif r.get("new") and r.get("old_predicted_cpu") and r["new"]["cpu"] > 0:
                ax.annotate(
                    f"~{r['old_predicted_cpu'] / r['new']['cpu']:.0f}x",
                    (r["n"], math.sqrt(r["old_predicted_cpu"] * r["new"]["cpu"])),
                    xytext=(5, 0),
                    textcoords="offset points",
                    fontsize=8,
                    va="center",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(mine[0]["n"] / 1.6, mine[-1]["n"] * 2.2)  # room for the labels
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("n (steps)")
        ax.set_ylabel("generation time, CPU seconds (median; whisker min-max)")
        spec = described.get(cfg)
        what = f"{spec[0]}, forward_cost {spec[1]:g}, adjoint_cost {spec[2]:g}" if spec else ""
        ax.set_title(f"config {cfg}: {what}\nlabel: old / new CPU time", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left")
    ns = sorted({r["n"] for r in rows})
    repeats = max(
        (len(r[w].get("runs", [])) for r in rows for w in ("old", "new") if r.get(w)), default=1
    )
    cmd = "python benchmarks/bench_multistage.py"
    if ns != [1000, 10000, 100000]:
        cmd += " --n " + " ".join(map(str, ns))
    if repeats != 3:
        cmd += f" --repeats {repeats}"
    if configs != ["A", "B"]:
        cmd += " --configs " + " ".join(configs)
    if only_new:
        cmd += " --only-new"
    fig.suptitle(
        "bench_multistage: Multistage(n, ...) generation, the new dynamic program vs "
        "the old one (each run in a fresh process, log-log)",
        fontsize=11,
    )
    _footer(fig, cmd, f"measured {d.get('when', '?')}")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, path)


# -- driver ------------------------------------------------------------------------------

#: benchmark name -> function(result dict, png path) -> png path
FIGURES: dict[str, Callable[[dict, Path], Path]] = {
    "tiers": _draw_tiers,
    "overlap": _draw_overlap,
    "lineage": _draw_lineage,
    "torch": _draw_torch,
    "multistage": _draw_multistage,
}


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultError(
            f"{path}: cannot read it as JSON ({error}); rerun the benchmark that writes it"
        ) from error
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def draw(name: str, results: Path | str = RESULTS, out: Path | str | None = None) -> Path:
    """Draw ``bench_<name>.png`` from ``bench_<name>.json``.

    **Arguments**

    - `name`: a key of :data:`FIGURES` (``"tiers"``, ``"overlap"``, ...).
    - `results`: the directory holding ``bench_<name>.json``.
    - `out`: where the PNG goes (default: `results`).

    **Returns** the path of the PNG.

    **Raises** :class:`FileNotFoundError` if the JSON does not exist,
    :class:`ResultError` (naming the file) if it is not valid JSON or lacks a
    field the figure needs, :class:`KeyError` for an unknown `name`.
    """
    if name not in FIGURES:
        raise KeyError(f"no figure for {name!r}; known: {', '.join(FIGURES)}")
    source = Path(results) / f"bench_{name}.json"
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist: run python benchmarks/bench_{name}.py")
    data = _load(source)
    target = Path(out if out is not None else results)
    target.mkdir(parents=True, exist_ok=True)
    png = target / f"bench_{name}.png"
    try:
        return FIGURES[name](data, png)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
        _pyplot().close("all")
        raise ResultError(
            f"{source}: not a complete bench_{name} result "
            f"({type(error).__name__}: {error}); rerun "
            f"python benchmarks/bench_{name}.py"
        ) from error


def draw_all(
    results: Path | str = RESULTS, only=None, out: Path | str | None = None, log=print
) -> dict[str, Path | None]:
    """Draw every figure of `only` (default: all) whose JSON exists in `results`.

    A missing JSON is skipped (reported through `log`, value None); a
    malformed one raises :class:`ResultError`.  Returns name -> PNG path.
    """
    drawn: dict[str, Path | None] = {}
    for name in only or FIGURES:
        if not (Path(results) / f"bench_{name}.json").is_file():
            log(f"skipped bench_{name}: no {Path(results) / f'bench_{name}.json'}")
            drawn[name] = None
            continue
        drawn[name] = draw(name, results, out)
        log(f"drew {drawn[name]}")
    return drawn


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="directory of the bench_<name>.json files (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the PNGs (default: --results, except for the "
        f"tracked benchmarks/results/: {default_out()})",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write the PNGs of benchmarks/results/ next to its JSONs",
    )
    parser.add_argument("--only", nargs="+", choices=list(FIGURES), default=None)
    args = parser.parse_args(argv)
    tracked = args.results.resolve() == RESULTS.resolve()
    if args.out is None:
        args.out = args.results if args.update_results or not tracked else default_out()
    elif args.update_results:
        parser.error("--update-results writes next to the JSONs of benchmarks/results/; drop --out")
    print(f"writing the figures to {args.out}")
    try:
        drawn = draw_all(args.results, args.only, args.out)
    except ResultError as error:
        print(f"figures: error: {error}", file=sys.stderr)
        return 1
    done = [n for n, p in drawn.items() if p is not None]
    print(f"{len(done)} of {len(drawn)} figures drawn" + (f": {', '.join(done)}" if done else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
