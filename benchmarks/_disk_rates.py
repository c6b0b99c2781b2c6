"""The zarr tier's disk rates against ``dd``: bursts, single records, prefetched reads.

Part of ``benchmarks/bench_tiers.py`` (JSON keys ``burst``, ``burst_cold``,
``single`` and ``read``).  Every write here is durable: the records go
through ``ZarrTier(durable=True)`` (every file and directory fsynced before
a record is listed), measured against ``dd`` doing the same: the device's
sequential write rate as the usual tool reports it.

**Writes** (:func:`write_rates`): `count` records of `record_bytes` (one
float64 leaf each), methods run interleaved, in rotating order, `rounds`
times:

* ``dd``: ``dd if=/dev/zero of=F bs=1M count=<bytes / 1 MiB>
  conv=fdatasync`` (wall time of the command), the reference;
* ``dd, bs=record``: the same with ``bs=<record> count=<count>`` (dd then
  also faults in a record-sized buffer of its own);
* ``store``: the states saved back to back into ``TieredStore([ZarrTier(
  durable=True)])`` with its default workers, timed from the first
  ``save`` until ``wait()`` returns (every record fsynced and published);
  the capture buffers are reserved first (``TieredStore.reserve``, what a
  run does before its time loop);
* ``store, 1 writer``: the same with ``workers=1`` (the default on two
  cores before ``waits_on_io``);
* ``put``: ``ZarrTier(durable=True).put`` of the records one after the
  other in the caller (no capture).

A burst is ``count`` > 1, a single record ``count`` = 1.  Rates are
bytes / median time; ``vs_dd`` is the median over rounds of the rate
divided by ``dd``'s rate in the same round (the paired ratio), with its
min and max (the spread).  The load average is recorded per round: other
processes share the cores and the disk.

**Memory** (``warm``): on a virtual machine that hands freed memory back
to its host (virtio-balloon free page reporting, as on the machine these
results come from), memory freed a second ago is *cold* again, and
touching it costs a host page fault per page: about 1.5-5.5 s per GiB
against 0.15 s warm (:func:`memory_touch`, recorded in the JSON).  A write
of fresh files needs fresh page-cache pages, the store needs capture
buffers too, so such a burst measures the host's page faults, not the
disk.  With ``warm=True`` every method's run is preceded by touching and
freeing 1.5x the burst's bytes, so that each method finds warm pages;
``burst_cold`` repeats the burst without it (memory as found).

**Reads** (:func:`read_rates`): `count` records saved durably through
``TieredStore([MemoryTier(), ZarrTier(durable=True)], plan=io_plan(
StoreAll(count, level=1)))``, then, once written, dropped from the page
cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` per chunk file, after their
fsync: the kernel then reads them from the device; no root needed and no
other process's cache touched; ``fincore`` confirms it where installed:
``resident_after_drop_bytes``), and read back in the plan's order:

* ``dd``: ``dd if=<chunk> of=/dev/null bs=1M`` per record, rate from
  dd's own reported times (no process start-up counted);
* ``readinto``: ``open(chunk, "rb", buffering=0).readinto`` of each chunk
  into a new ``np.empty`` (plain Python, the same bytes);
* ``readinto, reused``: the same into one buffer allocated (and touched)
  before, reused for every record: no page faults on the destination, the
  way ``dd`` reads (a 1 MiB buffer);
* ``readinto, page cache``: ``readinto`` into new arrays without dropping
  the page cache (the rate of a record still cached, for comparison);
* ``direct, reused``: ``os.readv`` with ``O_DIRECT`` (the device writes
  into the destination, no page-cache copy) into one page-aligned buffer
  allocated and touched before: what a read path with neither the kernel's
  copy nor fresh destination memory could reach (only where the file
  system accepts ``O_DIRECT``; absent elsewhere);
* ``store``: the backward pass: ``load(step, 1, copy=False)`` and
  ``delete`` in the plan's order, with the store reading ahead (its
  workers run ``ZarrTier.get``: reads into the store's pooled, page-aligned
  buffers, with ``O_DIRECT`` where accepted, and checksum verification;
  a buffer comes back to the pool when the record's ``delete`` ends the
  lease of its view).  Its rate
  is the bytes read from the zarr tier over the time of the whole backward
  pass: the records the write path kept in the read cache (``prefetch_bytes``
  = 2 records) count as time, not as bytes.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import statistics
import subprocess
import time

import numpy as np

from vlcc_adjoint.schedules import StoreAll, io_plan
from vlcc_adjoint.state import flatten
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier, make_record

__all__ = ["memory_touch", "read_rates", "write_rates"]

MIB = 1 << 20
_DD_TIME = re.compile(r"copied, ([0-9.]+) s")
_KEY = re.compile(r"u(\d+)-L1-\d+")


def warm_memory(nbytes: int) -> None:
    """Touch and free `nbytes` of memory, so the next allocations find warm pages."""
    a = np.empty(nbytes // 8)
    a.fill(1.0)
    del a


def memory_touch(nbytes: int, idle_s: float = 3.0) -> dict:
    """Seconds to touch `nbytes` of fresh memory right after freeing as much
    (``warm_s``) and after `idle_s` seconds idle (``after_idle_s``)."""
    warm_memory(nbytes)
    t0 = time.perf_counter()
    warm_memory(nbytes)
    warm = time.perf_counter() - t0
    time.sleep(idle_s)
    t0 = time.perf_counter()
    warm_memory(nbytes)
    return {
        "bytes": nbytes,
        "warm_s": warm,
        "after_idle_s": time.perf_counter() - t0,
        "idle_s": idle_s,
    }


def resident_bytes(paths) -> int | None:
    """Bytes of the files `paths` in the page cache, from util-linux ``fincore``
    (``None`` where it is not installed)."""
    if shutil.which("fincore") is None:
        return None
    done = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *paths],
        check=True,
        capture_output=True,
        text=True,
    )
    return sum(int(line) for line in done.stdout.split())


def drop_cached(paths) -> None:
    """Drop the (clean) page-cache pages of the files `paths`."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _states(record_bytes: int, count: int) -> list:
    return [np.full(record_bytes // 8, float(i)) for i in range(count)]


def _summary(times: dict, nbytes: int, ref: str, loads: list) -> dict:
    """Rates (MB/s) from the medians, paired ratios to `ref` per round, spread."""
    out = {"seconds": times, "load_avg_1min": loads, "MB_per_s": {}, "vs_" + ref: {}}
    for name, ts in times.items():
        out["MB_per_s"][name] = nbytes / statistics.median(ts) / 1e6
        ratios = [r / t for t, r in zip(ts, times[ref])]  # rate / ref rate, same round
        out["vs_" + ref][name] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
    return out


def write_rates(base: str, record_bytes: int, count: int, rounds: int, warm: bool = True) -> dict:
    """Durable writes of `count` records (see the module docstring)."""
    states = _states(record_bytes, count)
    records = [make_record(*reversed(flatten(s))) for s in states]
    total = record_bytes * count

    def run_dd(bs, n):
        target = os.path.join(base, "dd.bin")
        t0 = time.perf_counter()
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={target}", f"bs={bs}", f"count={n}", "conv=fdatasync"],
            check=True,
            capture_output=True,
        )
        dt = time.perf_counter() - t0
        os.unlink(target)
        return dt

    def run_store(workers):
        path = os.path.join(base, "burst-store")
        with TieredStore([ZarrTier(path, durable=True, mode="w")], workers=workers) as store:
            store.reserve(states[0], count)
            if warm:
                warm_memory(total + total // 2)
            t0 = time.perf_counter()
            for i, state in enumerate(states):
                store.save(i, state, 0)
            store.wait()
            dt = time.perf_counter() - t0
        shutil.rmtree(path)
        return dt

    def run_put():
        path = os.path.join(base, "burst-put")
        with ZarrTier(path, durable=True, mode="w") as tier:
            if warm:
                warm_memory(total + total // 2)
            t0 = time.perf_counter()
            for i, record in enumerate(records):
                tier.put(f"r{i}", record)
            dt = time.perf_counter() - t0
        shutil.rmtree(path)
        return dt

    methods = {
        "dd": lambda: run_dd(MIB, total // MIB),
        "dd, bs=record": lambda: run_dd(record_bytes, count),
        "store": lambda: run_store(None),
        "store, 1 writer": lambda: run_store(1),
        "put": run_put,
    }
    names = list(methods)
    times = {n: [] for n in names}
    loads = []
    for r in range(rounds):
        loads.append(os.getloadavg()[0])
        for name in names[r % len(names) :] + names[: r % len(names)]:
            os.sync()  # no earlier write-back left to compete with this one
            if warm and name.startswith("dd"):
                warm_memory(total + total // 2)
            times[name].append(methods[name]())
    out = _summary(times, total, "dd", loads)
    out.update(
        record_bytes=record_bytes, count=count, rounds=rounds, warm_memory=warm, durable=True
    )
    return out


def _walk_plan(store, schedule, states, upto_load: bool) -> None:
    """Perform the schedule's I/O actions; stop before the first Load if `upto_load`."""
    for action in schedule:
        name = type(action).__name__
        if name == "Save":
            store.save(action.step, states[action.step], action.level)
        elif name == "Load":
            if upto_load:
                return
            store.load(action.step, action.level, copy=False)  # valid until the Delete
        elif name == "Delete":
            store.delete(action.step, action.level)


def read_rates(
    base: str,
    record_bytes: int,
    count: int,
    rounds: int,
    warm: bool = True,
    prefetch_records: int = 2,
    workers: int | None = None,
) -> dict:
    """Reads of durable records not in the page cache (see the module docstring)."""
    states = _states(record_bytes, count + 1)
    schedule = StoreAll(count + 1, level=1)  # saves u_0 .. u_{count-1}, then reads them back
    names = [
        "dd",
        "readinto",
        "readinto, reused",
        "readinto, page cache",
        "direct, reused",
        "store",
    ]
    reused = np.ones(record_bytes // 8)
    aligned = mmap.mmap(-1, record_bytes)  # page-aligned, for O_DIRECT
    aligned.write(b"\1" * record_bytes)  # touched once, before any timing
    times = {n: [] for n in names}
    loads, disk_bytes, hits, resident = [], [], [], []
    for r in range(rounds):
        loads.append(os.getloadavg()[0])
        path = os.path.join(base, "read-store")
        store = TieredStore(
            [MemoryTier(), ZarrTier(path, durable=True, mode="w")],
            plan=io_plan(schedule),
            prefetch_bytes=prefetch_records * record_bytes,
            workers=workers,
        )
        with store:
            _walk_plan(store, schedule, states, upto_load=True)  # the forward pass
            store.wait()
            chunks = _chunks_in_load_order(path, count)
            if r == 0 and not _direct_ok(chunks[0]):
                names.remove("direct, reused")
                del times["direct, reused"]
            order = names[:-1]
            for name in order[r % len(order) :] + order[: r % len(order)]:
                drop_cached(chunks)
                if name == "readinto, page cache":
                    for c in chunks:  # bring them back into the page cache
                        _readinto(c, record_bytes)
                if warm:
                    warm_memory(record_bytes * count * 2)
                times[name].append(
                    _read_dd(chunks, record_bytes)
                    if name == "dd"
                    else _read_direct(chunks, record_bytes, aligned)
                    if name == "direct, reused"
                    else _read_py(chunks, record_bytes, reused if name.endswith("reused") else None)
                )
            drop_cached(chunks)
            resident.append(resident_bytes(chunks))
            if warm:
                warm_memory(record_bytes * count * 2)
            before = store.stats().tiers[1].bytes_out
            t0 = time.perf_counter()
            _walk_plan(store, _from_first_load(schedule), states, upto_load=False)
            dt = time.perf_counter() - t0
            stats = store.stats()
            got = stats.tiers[1].bytes_out - before
        shutil.rmtree(path)
        disk_bytes.append(got)
        hits.append({"prefetch_hits": stats.prefetch_hits, "loads": stats.loads})
        # rate over the bytes that came from the disk: the store's time per disk byte
        times["store"].append(dt * record_bytes * count / got if got else float("inf"))
    out = _summary(times, record_bytes * count, "dd", loads)
    out["vs_readinto"] = _summary(times, record_bytes * count, "readinto", loads)["vs_readinto"]
    out.update(
        record_bytes=record_bytes,
        count=count,
        rounds=rounds,
        warm_memory=warm,
        prefetch_bytes=prefetch_records * record_bytes,
        store_disk_bytes=disk_bytes,
        resident_after_drop_bytes=resident,
        store_stats=hits,
    )
    return out


def _chunks_in_load_order(path: str, count: int) -> list[str]:
    """The chunk files of the store's records (keys ``u<step>-L1-<n>``), last step first."""
    steps = {}
    for key in os.listdir(path):
        m = _KEY.fullmatch(key)
        if m:
            steps[int(m.group(1))] = os.path.join(path, key, "0", "c.0")
    chunks = [steps[k] for k in sorted(steps, reverse=True)]
    if len(chunks) != count or not all(os.path.isfile(c) for c in chunks):
        raise RuntimeError(
            f"expected {count} records with chunk files under {path}, found "
            f"{sorted(os.listdir(path))}: the zarr tier's layout changed"
        )
    return chunks


def _from_first_load(schedule):
    seen = False
    for action in schedule:
        if not seen and type(action).__name__ == "Load":
            seen = True
        if seen:
            yield action


def _readinto(path: str, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
    out = np.empty(nbytes // 8) if out is None else out
    with open(path, "rb", buffering=0) as f:
        if f.readinto(memoryview(out).cast("B")) != nbytes:
            raise RuntimeError(f"short read of {path}")
    return out


def _read_py(chunks, nbytes: int, out: np.ndarray | None) -> float:
    t0 = time.perf_counter()
    for c in chunks:
        _readinto(c, nbytes, out)
    return time.perf_counter() - t0


def _direct_ok(path: str) -> bool:
    """Whether the file system of `path` accepts ``O_DIRECT`` reads."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return False
    try:
        os.close(os.open(path, os.O_RDONLY | flag))
    except OSError:
        return False
    return True


def _read_direct(chunks, nbytes: int, buf: mmap.mmap) -> float:
    """``O_DIRECT`` reads of `chunks` into the page-aligned `buf` (block-sized
    requests of 8 MiB; a chunk's last request may be short)."""
    view = memoryview(buf)
    t0 = time.perf_counter()
    for c in chunks:
        fd = os.open(c, os.O_RDONLY | os.O_DIRECT)
        try:
            done = 0
            while done < nbytes:
                n = os.readv(fd, [view[done : done + 8 * MIB]])
                if n == 0:
                    raise RuntimeError(f"short read of {c}: {done} of {nbytes} bytes")
                done += n
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def _read_dd(chunks, nbytes: int) -> float:
    total = 0.0
    for c in chunks:
        done = subprocess.run(
            ["dd", f"if={c}", "of=/dev/null", f"bs={MIB}"],
            check=True,
            capture_output=True,
            text=True,
        )
        m = _DD_TIME.search(done.stderr)
        if m is None:
            raise RuntimeError(f"cannot read dd's time from {done.stderr!r}")
        total += float(m.group(1))
    return total
