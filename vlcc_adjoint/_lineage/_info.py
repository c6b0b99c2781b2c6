"""What ``History`` reports about itself: :class:`Usage` and :class:`LeafInfo`."""

from __future__ import annotations

import dataclasses
import json

__all__ = ["LeafInfo", "Usage", "short"]


@dataclasses.dataclass(frozen=True)
class Usage:
    """Storage used by a repository (``History.usage``).

    **Attributes:** `versions`, `branches`, `tags`, `chunks` (distinct
    chunks: loose files and entries of packs), `chunk_bytes` (their bytes on
    disk, after compression),
    `logical_bytes` (the sum over versions of their state's bytes: what
    storing every version whole would cost), `disk_bytes` (every file of
    the repository, each inode counted once: hard links are free).
    """

    versions: int
    branches: int
    tags: int
    chunks: int
    chunk_bytes: int
    logical_bytes: int
    disk_bytes: int

    @property
    def dedup_ratio(self) -> float:
        """`logical_bytes` / `disk_bytes`: how many times deduplication shrinks the versions."""
        return self.logical_bytes / self.disk_bytes if self.disk_bytes else 1.0


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    """One leaf of a version (``History.leaves``): where it sits and how it is stored."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunk_shape: tuple[int, ...]
    chunks: int
    codec: dict | None
    array: str  # the leaf's zarr array, relative to the repository root


def short(x) -> str:
    """A value of a version's meta, shortened for one line of ``History.draw``."""
    if isinstance(x, float):
        return f"{x:.4g}"
    text = json.dumps(x)
    return text if len(text) <= 24 else text[:21] + "..."
