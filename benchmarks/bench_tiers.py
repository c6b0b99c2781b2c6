"""Benchmark: capture copies, ZarrTier I/O against plain file I/O, disk rates against dd.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_tiers.py --quick        # ~25 s
    python benchmarks/bench_tiers.py                # full: ~3-4 min (machine load)
    python benchmarks/bench_tiers.py --dir /scratch --out DIR

Writes ``DIR/bench_tiers.json`` (``DIR`` defaults to ``$TMPDIR/vlcc-bench-results/``)
with every median, every repeat and the machine, and prints the tables.

(a) Capture: copying a 2-D float64 state (1024^2 = 8 MiB and 4096^2 =
128 MiB) into

* ``pool``: a buffer from the engine's :class:`BufferPool`, taken, filled
  with ``np.copyto`` and recycled, i.e. a buffer reused across captures
  (what :class:`~vlcc_adjoint.storage.TieredStore` does);
* ``reused``: ``np.copyto`` into one preallocated array, written before;
* ``fresh dst``: ``np.copyto`` into a just-allocated ``np.empty`` array
  (its pages are faulted in by the copy; the allocation is not timed);
* ``np.copy``: a fresh ``np.copy`` (allocation + first touch + copy).

(b) Tier writes of one float64 leaf of 64 KiB, 1 MiB, 16 MiB, 64 MiB
(the record is made once; its checksum is part of the capture, not of the
write):

* ``plain``: ``os.open(O_CREAT|O_TRUNC)`` / ``os.write`` / ``os.close`` of
  the same bytes to a new file (the floor any file-based store pays);
* ``zarr-tier``: ``ZarrTier.put`` in the steady state of a checkpointing run
  (records are deleted and saved, so puts reuse recycled directories);
* ``zarr-tier fresh``: ``ZarrTier(recycle=0).put``: every record in new
  directories (the first records of a run);
* ``zarr API``: ``zarr.create_array`` + ``arr[...] = x`` (one chunk, no
  compression): the straightforward way, for reference;
* ``get`` / ``plain read``: ``ZarrTier.get`` (read + checksum) against
  ``os.open`` / ``readv`` into ``np.empty`` / ``close``.

* ``plain rewrite``: the same bytes written over an existing file of the
  same size (no new inode): the floor of what recycling can reach.

(c) Disk rates against ``dd`` (``benchmarks/_disk_rates.py``, which
describes each method): durable bursts of 64 MiB records (JSON ``burst``,
memory warmed before each run, and ``burst_cold``, memory as found) and
single records (``single``) through the store, ``ZarrTier.put`` and ``dd
conv=fdatasync``; reads of records dropped from the page cache through the
store's read-ahead (``read``) against ``dd`` and a plain ``readinto``.
Ratios are paired per round (``vs_dd``), with their spread.

Deletes (and unlinks of the plain files) happen between timed calls and are
not timed.  The methods run interleaved, in rotating order, repeat after
repeat, so drifts of the machine (page cache writeback, the other tenants of
a shared VM) hit all of them alike.  The table shows medians and the
*paired* ratio to ``plain``: the median over rounds of the method's time
divided by ``plain``'s time in the same round (adjacent calls), which
cancels drift better than a ratio of medians (both are in the JSON).  Files
go to ``--dir`` (default: the system temporary directory): the page cache of
that file system, no fsync (ZarrTier's default; see its module docstring).
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

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vlcc_adjoint.state import flatten  # noqa: E402
from vlcc_adjoint.storage import ZarrTier, make_record  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


# -- (a) capture ------------------------------------------------------------------


def bench_capture(sizes, repeats):
    try:
        from vlcc_adjoint.storage._pool import BufferPool
    except ImportError:  # pragma: no cover - engine not there
        BufferPool = None
    rows = []
    for n in sizes:
        u = np.random.default_rng(0).standard_normal((n, n))
        reused = np.empty_like(u)
        reused.fill(1.0)
        pool = BufferPool(4 * u.nbytes) if BufferPool is not None else None
        if pool is not None:
            pool.reserve(u.dtype, u.shape, 1)

        def m_pool():
            buf = pool.take(u.dtype, u.shape)
            t0 = time.perf_counter()
            np.copyto(buf, u)
            dt = time.perf_counter() - t0
            held = [buf]
            del buf  # the pool takes back only buffers nobody else holds
            if not pool.recycle(held):
                raise RuntimeError("the pool refused its buffer: the benchmark holds a reference")
            return dt

        def m_reused():
            t0 = time.perf_counter()
            np.copyto(reused, u)
            return time.perf_counter() - t0

        def m_fresh_dst():
            dst = np.empty_like(u)
            t0 = time.perf_counter()
            np.copyto(dst, u)
            return time.perf_counter() - t0

        def m_copy():
            t0 = time.perf_counter()
            c = np.copy(u)
            dt = time.perf_counter() - t0
            del c
            return dt

        methods = {"pool": m_pool, "reused": m_reused, "fresh dst": m_fresh_dst, "np.copy": m_copy}
        if pool is None:
            del methods["pool"]
        times = _interleave(methods, repeats if n <= 1024 else max(3, repeats // 3))
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append(
                {
                    "n": n,
                    "bytes": u.nbytes,
                    "method": name,
                    "median_s": med,
                    "GB_s": u.nbytes / med / 1e9,
                    "times_s": ts,
                }
            )
    return rows


# -- (b) tier writes ----------------------------------------------------------------


def _plain_write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _plain_read(path, shape, dtype):
    out = np.empty(shape, dtype)
    view = memoryview(out.reshape(-1).view(np.uint8))
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < len(view):
            done += os.readv(fd, [view[done:]])
    finally:
        os.close(fd)
    return out


def bench_tiers(base, sizes, repeats, with_zarr_api=True):
    import zarr

    rows = []
    for nbytes in sizes:
        x = np.random.default_rng(1).standard_normal(nbytes // 8)
        leaves, spec = flatten({"u": x})
        record = make_record(spec, leaves)
        case = os.path.join(base, f"case{nbytes}")
        os.makedirs(os.path.join(case, "plain"))
        os.makedirs(os.path.join(case, "zapi"))
        tier = ZarrTier(os.path.join(case, "tier"))
        fresh = ZarrTier(os.path.join(case, "fresh"), recycle=0)
        counter = [0]

        def nxt():
            counter[0] += 1
            return counter[0]

        # steady state: a few records saved and deleted, as in a run
        for i in range(3):
            tier.put(f"w{i}", record)
        for i in range(3):
            tier.delete(f"w{i}")
        tier.put("r", record)
        _plain_write(os.path.join(case, "plain", "r"), x)

        def m_plain():
            path = os.path.join(case, "plain", f"p{nxt()}")
            t0 = time.perf_counter()
            _plain_write(path, x)
            dt = time.perf_counter() - t0
            os.unlink(path)
            return dt

        def m_rewrite():  # over the existing file, without truncating it
            t0 = time.perf_counter()
            _plain_write(os.path.join(case, "plain", "r"), x, os.O_WRONLY)
            return time.perf_counter() - t0

        def m_put(t):
            key = f"k{nxt()}"
            t0 = time.perf_counter()
            t.put(key, record)
            dt = time.perf_counter() - t0
            t.delete(key)
            return dt

        def m_zarr_api():
            path = os.path.join(case, "zapi", f"a{nxt()}")
            t0 = time.perf_counter()
            arr = zarr.create_array(
                store=path,
                shape=x.shape,
                chunks=x.shape,
                dtype=x.dtype,
                compressors=None,
                zarr_format=3,
            )
            arr[...] = x
            dt = time.perf_counter() - t0
            shutil.rmtree(path)
            return dt

        def m_get():
            t0 = time.perf_counter()
            tier.get("r")
            return time.perf_counter() - t0

        def m_plain_read():
            t0 = time.perf_counter()
            _plain_read(os.path.join(case, "plain", "r"), x.shape, x.dtype)
            return time.perf_counter() - t0

        methods = {
            "plain": m_plain,
            "plain rewrite": m_rewrite,
            "zarr-tier": lambda: m_put(tier),
            "zarr-tier fresh": lambda: m_put(fresh),
        }
        if with_zarr_api:
            methods["zarr API"] = m_zarr_api
        methods["plain read"] = m_plain_read
        methods["get"] = m_get
        reps = repeats[nbytes]
        times = _interleave(methods, reps)
        for name, ts in times.items():
            ref_ts = times["plain read" if name in ("get", "plain read") else "plain"]
            med, ref = statistics.median(ts), statistics.median(ref_ts)
            rows.append(
                {
                    "bytes": nbytes,
                    "method": name,
                    "median_s": med,
                    "ratio_to_plain": med / ref,
                    # the same ratio per round (adjacent calls), then the median:
                    # robust to the machine's drift between rounds
                    "paired_ratio": statistics.median(t / r for t, r in zip(ts, ref_ts)),
                    "GB_s": nbytes / med / 1e9,
                    "overhead_us": (med - ref) * 1e6,
                    "repeats": len(ts),
                    "times_s": ts,
                }
            )
        shutil.rmtree(case, ignore_errors=True)
    return rows


def bench_checksum():
    from vlcc_adjoint.storage._checksum import leaf_checksum

    x = np.random.default_rng(2).standard_normal(8 * MIB // 8 * 8)
    leaf_checksum(x)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        leaf_checksum(x)
        ts.append(time.perf_counter() - t0)
    return x.nbytes / statistics.median(ts) / 1e9


def _interleave(methods, repeats):
    """Run every method once per round, in rotating order; warm-up round discarded."""
    names = list(methods)
    times = {n: [] for n in names}
    for name in names:
        methods[name]()
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(methods[name]())
    return times


# -- report -------------------------------------------------------------------------


def _fmt_bytes(n):
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def print_tables(capture, tiers, checksum_gbs):
    print("\n(a) capture of a 2-D float64 state (GB/s, median)")
    sizes = sorted({r["n"] for r in capture})
    methods = list(dict.fromkeys(r["method"] for r in capture))
    print(f"{'state':>18} " + " ".join(f"{m:>11}" for m in methods))
    for n in sizes:
        cells = {r["method"]: r for r in capture if r["n"] == n}
        print(
            f"{f'{n}x{n} ({_fmt_bytes(n * n * 8)})':>18} "
            + " ".join(f"{cells[m]['GB_s']:>11.2f}" for m in methods)
        )
    print(f"\nchecksum (xxh3-64, one thread): {checksum_gbs:.1f} GB/s")
    print(
        "\n(b) one record of one float64 leaf: median time, paired ratio to plain write/read, GB/s"
    )
    methods = list(dict.fromkeys(r["method"] for r in tiers))
    print(f"{'record':>8} " + " ".join(f"{m:>21}" for m in methods))
    for nbytes in sorted({r["bytes"] for r in tiers}):
        cells = {r["method"]: r for r in tiers if r["bytes"] == nbytes}
        out = []
        for m in methods:
            r = cells[m]
            t = r["median_s"]
            ts = f"{t * 1e6:.0f}us" if t < 1e-2 else f"{t * 1e3:.1f}ms"
            out.append(f"{ts:>7} {r['paired_ratio']:>5.2f}x {r['GB_s']:>5.2f}")
        print(f"{_fmt_bytes(nbytes):>8} " + " ".join(f"{c:>21}" for c in out))


def verdict(tiers):
    """The targets: put within 2x of a plain write (64 KiB-64 MiB); large records >= 80%."""
    out = {}
    for method in ("zarr-tier", "zarr-tier fresh"):
        rows = [r for r in tiers if r["method"] == method]
        out[method] = {
            "within_2x_of_plain": {_fmt_bytes(r["bytes"]): r["paired_ratio"] <= 2.0 for r in rows},
            "bandwidth_fraction_large": {
                _fmt_bytes(r["bytes"]): 1.0 / r["paired_ratio"]
                for r in rows
                if r["bytes"] >= 16 * MIB
            },
        }
    return out


def bench_disk(base, quick):
    """(c): durable bursts and single records against dd, reads against dd and readinto."""
    import _disk_rates as D

    rec = 16 * MIB if quick else 64 * MIB
    count = 4 if quick else 16
    return {
        "memory_touch": D.memory_touch(256 * MIB if quick else 1024 * MIB, 3.0),
        "burst": D.write_rates(base, rec, count, 2 if quick else 7),
        "burst_cold": D.write_rates(base, rec, count, 1 if quick else 3, warm=False),
        "single": D.write_rates(base, rec, 1, 3 if quick else 9),
        "read": D.read_rates(base, rec, count, 2 if quick else 3),
    }


def print_disk(disk):
    touch = disk["memory_touch"]
    print(
        f"\n(c) durable writes and cold reads against dd (MB/s, median; paired ratio to dd "
        f"with min-max). Touching {_fmt_bytes(touch['bytes'])} of fresh memory: "
        f"{touch['warm_s']:.2f} s warm, {touch['after_idle_s']:.2f} s after "
        f"{touch['idle_s']:.0f} s idle"
    )
    for key, what in (
        ("burst", "burst"),
        ("burst_cold", "burst, memory as found"),
        ("single", "single record"),
        ("read", "read, not in page cache"),
    ):
        d = disk[key]
        cells = [
            f"{m} {d['MB_per_s'][m]:.0f} ({r['median']:.2f}x, {r['min']:.2f}-{r['max']:.2f})"
            for m, r in d["vs_dd"].items()
            if m != "dd"
        ]
        print(
            f"{what:>24}: {d['count']} x {_fmt_bytes(d['record_bytes'])}, dd "
            f"{d['MB_per_s']['dd']:.0f}; " + "; ".join(cells)
        )
    r = disk["read"]["vs_readinto"]["store"]
    print(f"{'':>24}  store vs readinto: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")


def _fs_of(path):
    best = ("?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if path.startswith(mnt) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype)
    except OSError:
        pass
    return {"mount": best[0], "type": best[1]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats, smaller records (~25 s)"
    )
    parser.add_argument("--dir", default=None, help="where the files go (default: system temp)")
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write bench_tiers.json into benchmarks/results/ (the tracked results)",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    args = parser.parse_args(argv)
    if args.update_results:
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

    import zarr

    base = tempfile.mkdtemp(prefix="bench-tiers-", dir=args.dir)
    sizes = [64 * KIB, MIB, 16 * MIB, 64 * MIB]
    if args.quick:
        repeats = {64 * KIB: 150, MIB: 40, 16 * MIB: 8, 64 * MIB: 5}
        cap_reps = 9
    else:
        repeats = {64 * KIB: 600, MIB: 150, 16 * MIB: 25, 64 * MIB: 12}
        cap_reps = 30
    t_start = time.time()
    try:
        capture = bench_capture([1024, 4096], cap_reps)
        checksum_gbs = bench_checksum()
        tiers = bench_tiers(base, sizes, repeats)
        disk = bench_disk(base, args.quick)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_tables(capture, tiers, checksum_gbs)
    print_disk(disk)
    result = {
        "benchmark": "bench_tiers",
        "quick": args.quick,
        "wall_s": time.time() - t_start,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "zarr": zarr.__version__,
            "filesystem": _fs_of(os.path.realpath(base)),
        },
        "capture": capture,
        "checksum_GB_s": checksum_gbs,
        "tiers": tiers,
        **disk,
        "targets": verdict(tiers),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_tiers.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\ntargets: {json.dumps(result['targets'], indent=1)}")
    print(f"wrote {path} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
