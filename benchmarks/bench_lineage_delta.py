"""Benchmark: delta chunks in a lineage History (``History(path, deltas=True)``).

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_lineage_delta.py                    # ~1 min
    python benchmarks/bench_lineage_delta.py --update-results   # rewrite benchmarks/results/

Writes ``DIR/bench_lineage_delta.json`` (``--out DIR``, default
``$TMPDIR/vlcc-bench-results/``; with ``--update-results``,
``benchmarks/results/``) and prints one table.

Three workloads, each committed with full chunks (the default) and with delta
chunks (``deltas=True``), 1 MiB chunks, raw (no codec):

* ``unaligned``: a 32 MiB state (random bytes: nothing compresses), 20
  versions; between two, 5 % of its bytes are rewritten in 64 KiB regions at
  random (unaligned) offsets.  The arithmetic minimum is one state plus the
  rewritten bytes: ``1 + 19 x 0.05 = 1.95`` states.  Goal: <= 1.05x it.
* ``adapters``: fine-tuning with a frozen 32 MiB float32 base and trainable
  low-rank adapters (8 pairs of 1024x16 and 16x1024 float32, 1 MiB in all)
  that change completely every version; 20 versions.  Cost per version:
  (bytes after 20 versions - bytes after the first) / 19, over the trainable
  bytes.  Goal: <= 1.1x.
* ``full``: full training: all 32 MiB of float32 weights (normal, std 0.02)
  change every version by an Adam-like step (``w -= lr * sign(g) * |u|``,
  ``u`` normal) of relative size 1e-4, 1e-3 and 1e-2; 5 versions each.  We
  report the bytes per version with full chunks, with deltas, and what the
  shuffled, LZ4-compressed XOR of parent and child would take if stored
  whatever its size (History stores a delta only below half a chunk).

Times (page cache, no fsync): commit = ``commit`` + ``wait`` per version,
median over versions 2..N; checkout = reading the last version back with a
fresh ``History`` (so nothing is cached in the process, chains resolved).
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vlcc_adjoint._lineage import _delta as D  # noqa: E402
from vlcc_adjoint.lineage import History  # noqa: E402

MIB = 1 << 20


def _run(path, states, deltas):
    """Commit `states` (a generator of state dicts); return bytes and times."""
    after, commit_s = [], []
    with History(path, chunk_bytes=MIB, deltas=deltas) as h:
        last = None
        for s in states:
            t0 = time.perf_counter()
            last = h.commit(s)
            h.wait()
            commit_s.append(time.perf_counter() - t0)
            after.append(h.usage().chunk_bytes)
        disk = h.usage().disk_bytes
    t0 = time.perf_counter()
    with History(path, mode="r") as h:
        h.checkout(last)
    checkout_s = time.perf_counter() - t0
    return {
        "chunk_bytes_after": after,
        "disk_bytes": disk,
        "commit_s_median": statistics.median(commit_s[1:]),
        "commit_s_first": commit_s[0],
        "checkout_last_s": checkout_s,
    }


def _unaligned(rng, nbytes, versions, frac, region):
    x = rng.integers(0, 256, nbytes, dtype=np.uint8)
    for k in range(versions):
        if k:
            for _ in range(int(frac * nbytes) // region):
                off = int(rng.integers(0, nbytes - region))
                x[off : off + region] = rng.integers(0, 256, region, dtype=np.uint8)
        yield {"x": x}


def _adapters(rng, base_bytes, versions):
    base = rng.standard_normal(base_bytes // 4).astype(np.float32)
    for _ in range(versions):
        ad = {f"a{i}": rng.standard_normal((1024, 16)).astype(np.float32) for i in range(8)}
        ad.update({f"b{i}": rng.standard_normal((16, 1024)).astype(np.float32) for i in range(8)})
        yield {"base": base, "adapters": ad}


def _full(rng, nbytes, versions, rel):
    w = (0.02 * rng.standard_normal(nbytes // 4)).astype(np.float32)
    for k in range(versions):
        if k:
            u = np.abs(rng.standard_normal(w.size)).astype(np.float32)
            w -= (
                np.float32(rel * 0.02) * np.sign(rng.standard_normal(w.size)).astype(np.float32) * u
            )
        yield {"w": w}


def _xor_ratio(rng, nbytes, rel):
    """Size of the shuffled LZ4-compressed XOR of parent and child over the raw bytes."""
    states = [s["w"].copy() for s in _full(rng, nbytes, 2, rel)]
    blob = D.encode(states[1].view(np.uint8), states[0].view(np.uint8), "0" * 32, 0, 0, 4)
    return len(blob) / states[1].nbytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=32, help="state size in MiB")
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--dir", default=None, help="where the repositories go (default: temp)")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write benchmarks/results/bench_lineage_delta.json",
    )
    args = parser.parse_args(argv)
    if args.update_results:
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    nbytes, n = args.mb * MIB, args.versions
    work = tempfile.mkdtemp(prefix="vlcc-delta-", dir=args.dir)
    t_start = time.time()
    res: dict = {}
    try:
        minimum = nbytes * (1 + (n - 1) * 0.05)
        un = {}
        for deltas in (False, True):
            r = _run(
                f"{work}/u{deltas}",
                _unaligned(np.random.default_rng(0), nbytes, n, 0.05, 64 << 10),
                deltas,
            )
            r["vs_one_version"] = r["chunk_bytes_after"][-1] / nbytes
            r["vs_minimum"] = r["chunk_bytes_after"][-1] / minimum
            un["deltas" if deltas else "full_chunks"] = r
        res["unaligned"] = {
            "state_bytes": nbytes,
            "versions": n,
            "changed_fraction": 0.05,
            "region_bytes": 64 << 10,
            "minimum_bytes": minimum,
            **un,
        }
        ad = {}
        trainable = 16 * 1024 * 16 * 4
        for deltas in (False, True):
            r = _run(f"{work}/a{deltas}", _adapters(np.random.default_rng(1), nbytes, n), deltas)
            b = r["chunk_bytes_after"]
            r["per_version_vs_trainable"] = (b[-1] - b[0]) / (n - 1) / trainable
            ad["deltas" if deltas else "full_chunks"] = r
        res["adapters"] = {"base_bytes": nbytes, "trainable_bytes": trainable, "versions": n, **ad}
        full = {}
        for rel in (1e-4, 1e-3, 1e-2):
            row = {"xor_lz4_vs_raw": _xor_ratio(np.random.default_rng(3), nbytes, rel)}
            for deltas in (False, True):
                r = _run(
                    f"{work}/f{rel}{deltas}",
                    _full(np.random.default_rng(2), nbytes, 5, rel),
                    deltas,
                )
                b = r["chunk_bytes_after"]
                r["per_version_vs_state"] = (b[-1] - b[0]) / 4 / nbytes
                row["deltas" if deltas else "full_chunks"] = r
            full[f"{rel:g}"] = row
        res["full_training"] = {"state_bytes": nbytes, "versions": 5, "relative_step": full}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "bench_lineage_delta",
        "chunk_bytes": MIB,
        "wall_s": time.time() - t_start,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "load_avg": os.getloadavg(),
        },
        **res,
        "targets": {
            "unaligned_vs_minimum_le_1.05": res["unaligned"]["deltas"]["vs_minimum"] <= 1.05,
            "adapters_per_version_le_1.1": res["adapters"]["deltas"]["per_version_vs_trainable"]
            <= 1.1,
        },
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_lineage_delta.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    u = res["unaligned"]
    print(f"(a) {n} versions of {args.mb} MiB, 5% rewritten in unaligned 64 KiB regions")
    print("    storage        vs one   vs min   commit/version  checkout last")
    for k in ("full_chunks", "deltas"):
        r = u[k]
        print(
            f"    {k:13s} {r['vs_one_version']:6.2f}x {r['vs_minimum']:6.2f}x "
            f"{r['commit_s_median'] * 1e3:9.1f} ms {r['checkout_last_s'] * 1e3:10.1f} ms"
        )
    print("(b) adapters: bytes per version / trainable bytes")
    for k in ("full_chunks", "deltas"):
        r = res["adapters"][k]
        print(
            f"    {k:13s} {r['per_version_vs_trainable']:6.3f}x  commit "
            f"{r['commit_s_median'] * 1e3:.1f} ms  checkout {r['checkout_last_s'] * 1e3:.1f} ms"
        )
    print("(c) full training: bytes per version / state bytes")
    for rel, row in full.items():
        print(
            f"    step {rel:>6s}: full chunks {row['full_chunks']['per_version_vs_state']:.3f}x"
            f"  deltas {row['deltas']['per_version_vs_state']:.3f}x"
            f"  XOR+shuffle+LZ4 {row['xor_lz4_vs_raw']:.3f}x"
        )
    print(f"\nwrote {path}; targets: {json.dumps(result['targets'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
