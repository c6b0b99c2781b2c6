"""Benchmark: collective commits of ``History(path, comm=comm[, local=dir])``, counted at 1-8 ranks, modelled at 4,096.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_mpi_lineage.py --quick        # ~1 minute
    python benchmarks/bench_mpi_lineage.py --mib 64       # 64 MiB per rank
    python benchmarks/bench_mpi_lineage.py --out DIR

Writes ``DIR/bench_mpi_lineage.json`` (``DIR`` defaults to
``$TMPDIR/vlcc-bench-results/``) and prints two tables.  The driver launches
``mpiexec -n P python benchmarks/bench_mpi_lineage.py --worker ...`` for
each ``P`` of ``--ranks``.

**What is measured, per commit.**  Every rank holds one
:class:`~vlcc_adjoint.mpi.DistributedArray` block of ``--mib`` MiB (random
float64) plus a few replicated values.  Three commits of the same state
follow each other: the first writes every chunk, the second changes 10 % of
each block's rows (dedup: only those chunks are new), the third commits it
again to a repository opened with ``durable=True`` (fsync before
publication).  Reported, for each: the time the slowest rank is blocked in
``commit`` (the collective commit is synchronous: it returns once the
version is visible), next to a ``memcpy`` of the rank's state
(``np.copyto`` into a preallocated buffer); the files created under the
shared path (rank 0 lists the tree before and after: chunk files in
``chunks/``, the hard links and ``zarr.json`` files of the version group
in ``versions/``, the graph); and the metadata calls the ranks issued on
the shared path, summed over ranks (Python-level ``open``, ``stat``,
``lstat``, ``mkdir``, ``rename``/``replace``, ``link``, ``unlink``,
``scandir``/``listdir``: each is at least one metadata operation of the
file system, counted by wrapping those functions of ``os`` and
``builtins`` in the worker).  The machine may be oversubscribed (more ranks
than cores): read the counts, which do not depend on it, before the times.

Loads: the newest version on the ``P`` ranks that wrote it, and the
first version (an ancestor) on ``Q = P - 1`` ranks (a sub-communicator),
each the slowest rank's best of three.

**The node-local tier** (``--local DIR``, default ``/dev/shm``; ``--local ''``
skips it).  Three commits to another repository opened with ``local=DIR``:
the first (it also touches the staging map's pages for the first time), then
two with 10 % of the rows changed (steady state).  For each: the slowest
rank's blocked time in ``commit`` next to the ``memcpy`` and to the durable
synchronous commit above, the time until ``wait`` returned (flushed by the
node leader's thread as one pack and published), the files created on the
shared path (data files: packs and loose chunks; plus the version's
manifest) and the metadata calls on it, the flush thread's included; and
the two loads of that repository.  Runs with more ranks than cores are
marked oversubscribed: count them, do not read their times.

**The model** (printed, and in the JSON's ``model``).  With ``S`` bytes per
rank, chunk size ``c``, ``P`` ranks, ``n = ceil(S / c)`` chunks per block:

* files created per version: ``P n`` chunk files (new content only) plus
  ``P n`` hard links and ``P + 2`` small documents in the version group, plus
  the graph file: **linear in P n**, i.e. one data file per chunk, not one
  per node.  The node-local tier with an aggregated flush (a few large files
  per node) is ``local=`` (below).
* metadata operations per rank: ``m(S) = m_0 + m_1 n`` (fitted on the
  measured counts of rank > 0, which stage only their own blocks), and on
  rank 0 another ``~ 3 P n`` for the version group (links of every rank's
  chunks: rank 0 publishes alone).
* commit time: ``T(P) = S / min(b, B_node / r, B_fs / P) + P m(S) / R_md
  + 3 P n / R_md + 8 log2(P) lambda``: data at the per-rank bandwidth ``b``
  measured here (capped by a node's injection ``B_node`` shared by ``r``
  ranks per node and the file system's aggregate ``B_fs``), the ranks'
  metadata operations through the metadata servers' aggregate rate
  ``R_md``, rank 0's publication of the version group, and eight
  latency-bound collectives.  Blocked time = ``T(P)`` (synchronous commit).

The packed flush (``local=``), with ``r`` ranks per node and ``P / r`` nodes:

* files created per version: ``P / r`` packs plus the version's manifest
  (the graph file is replaced, not added): **independent of leaves and
  chunks**;
* blocked time: ``rho S / b_copy + 6 log2(P) lambda``, the copy at the
  measured copy rate times the measured steady-state ratio ``rho`` of
  blocked time to ``memcpy`` (the agreements and flatten are in ``rho``),
  plus three agreements' latency;
* flush time (background): ``r S / min(b_leader, B_node, B_fs r / P) +
  (P / r) m_node / R_md``: one leader thread per node packs its ``r`` ranks'
  bytes at the rate ``b_leader`` measured here (hash, copy into the pack,
  fsync), capped by the node's injection and its share of the file system,
  plus each node's measured metadata calls (``m_node``) through the
  metadata servers.  The version is visible after the flush; the caller
  waited only for the copy.

Defaults of the stated file system (``--fs-gbs``, ``--node-gbs``,
``--ranks-per-node``, ``--md-rate``, ``--latency``): 1 TB/s aggregate,
25 GB/s per node, 64 ranks per node, 50,000 metadata operations per second,
2 us per network hop; 64 MiB per rank and 1 MiB chunks for the predictions
at 64, 512 and 4,096 ranks.  The model says where the synchronous,
file-per-chunk design stops scaling (the metadata term, quadratic in P
through rank 0's links); the node-local tier's flush writes ``P / r`` files
per version, and its caller is blocked for a copy.
"""

from __future__ import annotations

import argparse
import builtins
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_OS_CALLS = ("open", "stat", "lstat", "mkdir", "rename", "replace", "link", "unlink")
_OS_CALLS += ("scandir", "listdir", "rmdir")


class MetadataCounter:
    """Counts calls of ``os`` / ``builtins.open`` whose path lies under `root`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.count = 0
        self.by_call: dict[str, int] = {}
        self._saved: dict[tuple[object, str], object] = {}
        self.on = False

    def _wrap(self, module, name: str) -> None:
        original = getattr(module, name)
        self._saved[(module, name)] = original

        def counted(*args, **kwargs):
            if self.on and args:
                path = args[0]
                if isinstance(path, (str, bytes, os.PathLike)):
                    text = os.fsdecode(path)
                    if text.startswith(self.root):
                        self.count += 1
                        self.by_call[name] = self.by_call.get(name, 0) + 1
            return original(*args, **kwargs)

        setattr(module, name, counted)

    def __enter__(self) -> MetadataCounter:
        for name in _OS_CALLS:
            self._wrap(os, name)
        self._wrap(builtins, "open")
        return self

    def __exit__(self, *exc) -> None:
        for (module, name), original in self._saved.items():
            setattr(module, name, original)


def _tree(path: str) -> set[str]:
    out = set()
    for top, _, files in os.walk(path):
        out.update(os.path.relpath(os.path.join(top, f), path) for f in files)
    return out


def _counted_commit(h, path: str, comm, state, kind: str, wait: bool):
    """One collective ``h.commit(state)`` of the History `h` at `path`, timed
    and counted: this rank's blocked seconds, the seconds until ``h.wait()``
    returned (with `wait`; else ``None``), the files it created under `path`
    (listed on rank 0; empty elsewhere) and every rank's metadata calls
    (gathered on rank 0; ``None`` elsewhere)."""
    rank = comm.Get_rank()
    before = _tree(path) if rank == 0 else set()
    comm.Barrier()
    flushed = None
    with MetadataCounter(path) as counter:
        counter.on = True
        t0 = time.perf_counter()
        h.commit(state, message=kind)
        blocked = time.perf_counter() - t0
        if wait:
            h.wait()
            flushed = time.perf_counter() - t0
        counter.on = False
    after = _tree(path) if rank == 0 else set()
    return blocked, flushed, sorted(after - before), comm.gather(counter.count, root=0)


def worker(a) -> None:
    from mpi4py import MPI

    from vlcc_adjoint.lineage import History
    from vlcc_adjoint.mpi import Decomposition, DistributedArray

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rows_per_rank = max(1, int(a.mib * (1 << 20)) // (8 * 128))
    d = Decomposition.split((rows_per_rank * size, 128), (size, 1))
    rng = np.random.default_rng(rank)
    local = rng.standard_normal(d.local_shape(rank))
    state = {"u": DistributedArray(local, d, rank), "step": 0, "dt": 0.1}
    spare = np.empty_like(local)
    copies = []
    for _ in range(5):
        comm.Barrier()
        t0 = time.perf_counter()
        np.copyto(spare, local)
        copies.append(time.perf_counter() - t0)
    memcpy = float(comm.allreduce(min(copies), op=MPI.MAX))
    results = []
    for kind, durable in (("first", False), ("10% changed", False), ("durable", True)):
        path = a.dir if not durable else a.dir + "-durable"
        if kind == "10% changed":
            k = max(1, local.shape[0] // 10)
            local[:k] += 1.0
            state["step"] = 1
        with History(path, comm=comm, durable=durable, chunk_bytes=a.chunk_bytes) as h:
            blocked, _, new, ops = _counted_commit(h, path, comm, state, kind, wait=False)
        results.append(
            {
                "commit": kind,
                "blocked_s": float(comm.allreduce(blocked, op=MPI.MAX)),
                "files_created": len(new),
                "chunk_files": sum(1 for f in new if f.startswith("chunks")),
                "version_entries": sum(1 for f in new if f.startswith("versions")),
                "metadata_ops_total": int(sum(ops)) if rank == 0 else None,
                "metadata_ops_rank0": int(ops[0]) if rank == 0 else None,
                "metadata_ops_other_ranks_mean": (
                    float(np.mean(ops[1:])) if rank == 0 and size > 1 else None
                ),
            }
        )
    load_newest, load_ancestor = _loads(a.dir, comm)
    local_results, local_loads = [], (None, None)
    if a.local:
        local_results = _local_commits(a, comm, state, local, memcpy)
        local_loads = _loads(a.dir + "-local", comm)
    if rank == 0:
        out = {
            "load_newest_on_P_s": load_newest,
            "load_ancestor_on_P_minus_1_s": load_ancestor,
            "ranks": size,
            "bytes_per_rank": int(local.nbytes),
            "chunk_bytes": a.chunk_bytes,
            "memcpy_s": memcpy,
            "commits": results,
            "oversubscribed": size > (os.cpu_count() or 1),
            "local_commits": local_results,
            "local_load_newest_on_P_s": local_loads[0],
            "local_load_ancestor_on_P_minus_1_s": local_loads[1],
        }
        with open(a.result, "w") as f:
            json.dump(out, f)


def _loads(path: str, comm) -> tuple[float, float | None]:
    """The slowest rank's best of three loads of the newest version on the P
    ranks that wrote it, and of the first version (an ancestor) on Q = P - 1
    ranks (a sub-communicator; ``None`` at P = 1)."""
    from mpi4py import MPI

    from vlcc_adjoint.lineage import History

    rank, size = comm.Get_rank(), comm.Get_size()
    with History(path, comm=comm) as h:
        ids = [v.id for v in h.log()]
        times = []
        for _ in range(3):
            comm.Barrier()
            t0 = time.perf_counter()
            h.load(ids[0])
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        load_newest = min(times)
    load_ancestor = None
    if size > 1:
        sub = comm.Split(0 if rank < size - 1 else 1, rank)
        if rank < size - 1:
            with History(path, comm=sub) as h:
                times = []
                for _ in range(3):
                    sub.Barrier()
                    t0 = time.perf_counter()
                    h.load(ids[-1])
                    times.append(sub.allreduce(time.perf_counter() - t0, op=MPI.MAX))
                load_ancestor = min(times)
        sub.Free()
    return load_newest, load_ancestor


def _local_commits(a, comm, state: dict, local: np.ndarray, memcpy: float) -> list[dict]:
    """Commits through the node-local tier (``local=a.local``) to ``a.dir-local``:
    the first (its staging map's pages touched for the first time), then two
    with 10 % of the rows changed (steady state: the map is reused).  For each:
    the slowest rank's blocked time in ``commit``, the time until ``wait``
    returned (flushed and published), the files created on the shared path and
    the metadata calls on it (the flush threads' included)."""
    from mpi4py import MPI

    from vlcc_adjoint.lineage import History

    rank = comm.Get_rank()
    path = a.dir + "-local"
    out = []
    with History(path, comm=comm, chunk_bytes=a.chunk_bytes, local=a.local) as h:
        for kind in ("local first", "local 10% changed", "local 10% changed"):
            if kind != "local first":
                k = max(1, local.shape[0] // 10)
                local[:k] += 1.0
                state["step"] += 1
            blocked, flushed, new, ops = _counted_commit(h, path, comm, state, kind, wait=True)
            out.append(
                {
                    "commit": kind,
                    "blocked_s": float(comm.allreduce(blocked, op=MPI.MAX)),
                    "blocked_x_memcpy": float(comm.allreduce(blocked, op=MPI.MAX)) / memcpy,
                    "until_published_s": float(comm.allreduce(flushed, op=MPI.MAX)),
                    "files_created": len(new),
                    "data_files": sum(1 for f in new if f.startswith(("packs", "chunks"))),
                    "new_files": new if rank == 0 else None,
                    "metadata_ops_total": int(sum(ops)) if rank == 0 else None,
                }
            )
    return out


def model(runs: list[dict], a) -> dict:
    """The stated model's parameters from the runs, and its predictions."""
    first = [r for r in runs if r["ranks"] > 1] or runs
    # The per-rank bandwidth of a first commit, from the run on the fewest ranks
    # (one rank where it ran: no rank shares the cores with another).
    fewest = min(r["ranks"] for r in runs)
    per_rank_bw = min(
        r["bytes_per_rank"] / r["commits"][0]["blocked_s"] for r in runs if r["ranks"] == fewest
    )
    # m(S) = m0 + m1 n from the ranks > 0 of the first commit (or rank 0 serially)
    pts = []
    for r in first:
        n = math.ceil(r["bytes_per_rank"] / r["chunk_bytes"])
        c = r["commits"][0]
        m = c["metadata_ops_other_ranks_mean"] or c["metadata_ops_rank0"]
        pts.append((n, m))
    n0, m0 = pts[0]
    m1 = m0 / n0  # through the origin: the fixed part is small next to n
    S, c = a.model_mib * (1 << 20), a.model_chunk_bytes
    n = math.ceil(S / c)
    out = {
        "assumptions": {
            "bytes_per_rank": S,
            "chunk_bytes": c,
            "per_rank_bandwidth_Bps": per_rank_bw,
            "fs_aggregate_Bps": a.fs_gbs * 1e9,
            "node_injection_Bps": a.node_gbs * 1e9,
            "ranks_per_node": a.ranks_per_node,
            "metadata_ops_per_s": a.md_rate,
            "latency_s": a.latency,
            "metadata_ops_per_rank": f"{m1:.2f} per chunk (measured)",
        },
        "predictions": [],
    }
    for P in (64, 512, 4096):
        bw = min(per_rank_bw, a.node_gbs * 1e9 / a.ranks_per_node, a.fs_gbs * 1e9 / P)
        data = S / bw
        meta = P * m1 * n / a.md_rate + 3 * P * n / a.md_rate
        coll = 8 * math.log2(P) * a.latency
        total = data + meta + coll
        out["predictions"].append(
            {
                "ranks": P,
                "data_s": data,
                "metadata_s": meta,
                "collectives_s": coll,
                "commit_s": total,
                "blocked_s": total,
                "files_created": 2 * P * n + P + 3,
            }
        )
    # The node-local tier: blocked = the copy (at the measured copy rate, times
    # the measured steady-state blocked/memcpy ratio) + three agreements; the
    # flush = one leader thread per node packing its r ranks' r S bytes at the
    # rate measured here (capped by the node's injection and the node's share of
    # the file system) + each node's measured metadata calls through R_md.
    local_runs = [r for r in runs if r.get("local_commits") and not r["oversubscribed"]]
    if local_runs:
        best = max(local_runs, key=lambda r: r["ranks"])
        steady = best["local_commits"][-1]
        ratio = steady["blocked_s"] / best["memcpy_s"]
        copy_bw = best["bytes_per_rank"] / best["memcpy_s"]
        flush_s = max(steady["until_published_s"] - steady["blocked_s"], 1e-9)
        leader_bw = best["ranks"] * best["bytes_per_rank"] / flush_s
        md_node = steady["metadata_ops_total"]
        r = a.ranks_per_node
        out["local_assumptions"] = {
            "copy_Bps": copy_bw,
            "blocked_over_memcpy_measured": ratio,
            "leader_pack_Bps_measured": leader_bw,
            "metadata_ops_per_node_measured": md_node,
            "measured_at_ranks": best["ranks"],
        }
        out["local_predictions"] = []
        for P in (64, 512, 4096):
            nodes = max(1, P // r)
            blocked = ratio * S / copy_bw + 6 * math.log2(P) * a.latency
            bw = min(leader_bw, a.node_gbs * 1e9, a.fs_gbs * 1e9 / nodes)
            flush = min(r, P) * S / bw + nodes * md_node / a.md_rate
            out["local_predictions"].append(
                {
                    "ranks": P,
                    "nodes": nodes,
                    "blocked_s": blocked,
                    "flush_s": flush,
                    "files_created": nodes + 1,
                    "sync_commit_s": next(
                        p["commit_s"] for p in out["predictions"] if p["ranks"] == P
                    ),
                }
            )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 MiB per rank")
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument(
        "--local",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="node-local directory of the local= commits ('' to skip them)",
    )
    ap.add_argument("--mib", type=float, default=None, help="MiB per rank (default 16)")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20)
    ap.add_argument("--fs-gbs", type=float, default=1000.0)
    ap.add_argument("--node-gbs", type=float, default=25.0)
    ap.add_argument("--ranks-per-node", type=int, default=64)
    ap.add_argument("--md-rate", type=float, default=50_000.0)
    ap.add_argument("--latency", type=float, default=2e-6)
    ap.add_argument("--model-mib", type=float, default=64.0)
    ap.add_argument("--model-chunk-bytes", type=int, default=1 << 20)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    load_before = os.getloadavg()
    if a.mib is None:
        a.mib = 4.0 if a.quick else 16.0
    if a.worker:
        worker(a)
        return
    mpiexec = shutil.which(
        "mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    )
    if mpiexec is None:
        sys.exit("no mpiexec: pip install mpich")
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for P in a.ranks:
            result = os.path.join(tmp, f"r{P}.json")
            cmd = [mpiexec, "-n", str(P), sys.executable, os.path.abspath(__file__), "--worker"]
            cmd += ["--mib", str(a.mib), "--chunk-bytes", str(a.chunk_bytes)]
            cmd += ["--dir", os.path.join(tmp, f"h{P}"), "--result", result]
            cmd += ["--local", a.local or ""]
            subprocess.run(cmd, check=True, env=env, timeout=900)
            with open(result) as f:
                runs.append(json.load(f))
    print(
        f"{'P':>3} {'commit':>12} {'blocked s':>10} {'x memcpy':>9} {'files':>6} "
        f"{'chunks':>6} {'md ops':>7} {'rank0':>6}"
    )
    for r in runs:
        for c in r["commits"]:
            print(
                f"{r['ranks']:>3} {c['commit']:>12} {c['blocked_s']:>10.4f} "
                f"{c['blocked_s'] / r['memcpy_s']:>9.1f} {c['files_created']:>6} "
                f"{c['chunk_files']:>6} {c['metadata_ops_total']:>7} {c['metadata_ops_rank0']:>6}"
            )
    for r in runs:
        if r["load_ancestor_on_P_minus_1_s"] is not None:
            ratio = r["load_ancestor_on_P_minus_1_s"] / r["load_newest_on_P_s"]
            print(
                f"P={r['ranks']}: load newest on P {r['load_newest_on_P_s']:.4f} s, "
                f"ancestor on P-1 {r['load_ancestor_on_P_minus_1_s']:.4f} s ({ratio:.2f}x)"
            )
    if any(r.get("local_commits") for r in runs):
        print(
            f"{'P':>3} {'local commit':>18} {'blocked s':>10} {'x memcpy':>9} "
            f"{'x durable':>9} {'published s':>11} {'data files':>10} {'files':>6} {'md ops':>7}"
        )
    for r in runs:
        durable = next(c["blocked_s"] for c in r["commits"] if c["commit"] == "durable")
        for c in r.get("local_commits") or []:
            print(
                f"{r['ranks']:>3} {c['commit']:>18} {c['blocked_s']:>10.4f} "
                f"{c['blocked_x_memcpy']:>9.2f} {c['blocked_s'] / durable:>9.3f} "
                f"{c['until_published_s']:>11.4f} {c['data_files']:>10} {c['files_created']:>6} "
                f"{c['metadata_ops_total']:>7}"
                + ("  (oversubscribed)" if r["oversubscribed"] else "")
            )
        if r.get("local_load_ancestor_on_P_minus_1_s") is not None:
            ratio = r["local_load_ancestor_on_P_minus_1_s"] / r["local_load_newest_on_P_s"]
            print(
                f"P={r['ranks']} local: load newest on P {r['local_load_newest_on_P_s']:.4f} s, "
                f"ancestor on P-1 {r['local_load_ancestor_on_P_minus_1_s']:.4f} s ({ratio:.2f}x)"
            )
    m = model(runs, a)
    print("model:", json.dumps(m["assumptions"]))
    for p in m["predictions"]:
        print(
            f"P={p['ranks']:>5}: commit {p['commit_s']:.2f} s (data {p['data_s']:.2f}, "
            f"metadata {p['metadata_s']:.2f}), files {p['files_created']}"
        )
    for p in m.get("local_predictions", []):
        print(
            f"P={p['ranks']:>5} local=: blocked {p['blocked_s']:.3f} s, flush {p['flush_s']:.2f} s "
            f"(synchronous commit {p['sync_commit_s']:.2f} s), files {p['files_created']}"
        )
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "bench_mpi_lineage.json")
    with open(path, "w") as f:
        machine = {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        }
        json.dump({"runs": runs, "model": m, "args": vars(a), "machine": machine}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
