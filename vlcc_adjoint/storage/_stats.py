"""What a :class:`~vlcc_adjoint.storage.TieredStore` did: bytes, records, time.

Time accounting (all in seconds, wall clock, ``time.perf_counter``):

- ``stall_seconds``: time the caller spent blocked inside ``save``, ``load``,
  ``move`` and ``delete`` waiting for storage: for staging room, for tier
  capacity held by pending work, for an in-flight prefetch, for a pending
  write or move, or doing a tier read itself because nothing was prefetched.
  The capture copy (``capture_seconds``) and the copy into the caller's
  arrays are not stalls: they are the price of owning the data.
- ``flush_seconds``: time blocked in ``wait()`` and ``close()``.
- ``io_seconds``: busy time of the background workers (checksums,
  compression, tier ``put``/``get``/``delete``), summed over workers; with
  ``workers=0`` this work runs in the caller and is counted in both
  ``io_seconds`` and ``stall_seconds``.
- ``hidden_io_seconds = max(0, io_seconds - stall_seconds - flush_seconds)``:
  the background I/O the caller did not wait for, i.e. that ran while the
  caller computed.  ``hidden_fraction = hidden_io_seconds / io_seconds``.
  Every second the caller waited is charged to I/O, so this is a lower
  bound on the overlap.
"""

from __future__ import annotations

import dataclasses

__all__ = ["StoreStats", "TierStats"]


@dataclasses.dataclass(frozen=True)
class TierStats:
    """Traffic and occupancy of one storage level.

    **Attributes:** `level`, `name`; `bytes_in` / `bytes_out`: uncompressed
    bytes written to / read from the tier; `puts`, `gets`, `deletes`;
    `records`: records the tier holds for this store now; `raw_bytes`: their
    uncompressed size; `used_bytes` and `capacity_bytes` (``None`` when
    unbounded) as the tier reports them; `compression_ratio`:
    ``raw_bytes / used_bytes`` (``None`` while the tier is empty).
    """

    level: int
    name: str
    bytes_in: int
    bytes_out: int
    puts: int
    gets: int
    deletes: int
    records: int
    raw_bytes: int
    used_bytes: int
    capacity_bytes: int | None
    compression_ratio: float | None


@dataclasses.dataclass(frozen=True)
class StoreStats:
    """A snapshot of a :class:`~vlcc_adjoint.storage.TieredStore`'s counters.

    See the module docstring of ``vlcc_adjoint.storage._stats`` for the time
    definitions.  Byte counts are uncompressed unless named otherwise.

    **Attributes:**

    - `tiers`: one :class:`TierStats` per level.
    - `saves`, `loads`, `moves`, `deletes`: calls made; `spills`: records
      stored on a slower level than asked for (``policy="spill"``).
    - `captured_bytes`: bytes copied into store-owned buffers by ``save``;
      `referenced_bytes`: bytes of immutable leaves kept by reference;
      `capture_seconds`: time of those copies (each computes the leaf's
      checksum in the same pass).
    - `stall_seconds`, `flush_seconds`, `io_seconds`, `hidden_io_seconds`.
    - `prefetch_issued`: reads started ahead of time; `prefetch_hits`: loads
      served from the read cache (prefetched, or kept there after their
      write; `prefetch_late` of them had to wait for the read to finish);
      `prefetch_misses`: loads from a prefetch level that had to read the
      tier in the caller; `prefetch_wasted`: prefetched records evicted
      before use; `staged_hits`: loads served from a capture still being
      written.
    - `dedup_hits`, `dedup_bytes_saved`: leaves found identical to one
      already held, stored once.
    - `staging_bytes`, `cache_bytes`: bytes held now;
      `peak_staging_bytes`, `peak_cache_bytes`: their maxima;
      `staging_limit`, `cache_limit`: the budgets.
    - `pool_reused`, `pool_allocated`: capture buffers reused / freshly
      allocated.
    """

    tiers: tuple[TierStats, ...]
    saves: int
    loads: int
    moves: int
    deletes: int
    spills: int
    captured_bytes: int
    referenced_bytes: int
    capture_seconds: float
    stall_seconds: float
    flush_seconds: float
    io_seconds: float
    prefetch_issued: int
    prefetch_hits: int
    prefetch_late: int
    prefetch_misses: int
    prefetch_wasted: int
    staged_hits: int
    dedup_hits: int
    dedup_bytes_saved: int
    staging_bytes: int
    cache_bytes: int
    peak_staging_bytes: int
    peak_cache_bytes: int
    staging_limit: int
    cache_limit: int
    pool_reused: int
    pool_allocated: int

    @property
    def hidden_io_seconds(self) -> float:
        """Background I/O time the caller did not wait for."""
        return max(0.0, self.io_seconds - self.stall_seconds - self.flush_seconds)

    @property
    def hidden_fraction(self) -> float:
        """``hidden_io_seconds / io_seconds`` (1.0 when there was no I/O)."""
        return self.hidden_io_seconds / self.io_seconds if self.io_seconds > 0 else 1.0

    @property
    def capture_bandwidth(self) -> float:
        """Bytes per second of the capture copies (0.0 before any)."""
        return self.captured_bytes / self.capture_seconds if self.capture_seconds > 0 else 0.0

    def __str__(self) -> str:
        lines = [
            f"saves {self.saves}, loads {self.loads}, moves {self.moves}, "
            f"deletes {self.deletes}, spills {self.spills}",
            f"stall {self.stall_seconds:.3f} s, flush {self.flush_seconds:.3f} s, "
            f"background io {self.io_seconds:.3f} s ({100 * self.hidden_fraction:.0f}% hidden)",
            f"prefetch: {self.prefetch_issued} issued, {self.prefetch_hits} hits "
            f"({self.prefetch_late} late), {self.prefetch_misses} misses, "
            f"{self.prefetch_wasted} wasted; staged hits {self.staged_hits}",
            f"dedup: {self.dedup_hits} leaves, {self.dedup_bytes_saved} B saved",
            f"peak staging {self.peak_staging_bytes} / {self.staging_limit} B, "
            f"peak cache {self.peak_cache_bytes} / {self.cache_limit} B",
        ]
        for t in self.tiers:
            ratio = "-" if t.compression_ratio is None else f"{t.compression_ratio:.2f}x"
            lines.append(
                f"  level {t.level} {t.name}: {t.records} records, in {t.bytes_in} B, "
                f"out {t.bytes_out} B, used {t.used_bytes} B, ratio {ratio}"
            )
        return "\n".join(lines)
