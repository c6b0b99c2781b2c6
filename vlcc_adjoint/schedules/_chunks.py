"""Action tables produced chunk by chunk, in bounded memory.

A Revolve or Multistage table of ``n = 10^7`` steps has about ``4.4 n``
rows of 19 bytes (840 MiB), yet the recursion that emits it holds only an
explicit stack of ``O(c + r)`` segments.  So instead of the table, a
schedule keeps the emitter: a kernel ``fill(out, write, state, limit)`` that
continues the recursion from ``state`` (one ``int64`` array: the stack and a
few registers), writes rows into ``out`` while at least ``unit`` rows of
room are left below ``limit`` (or only counts them when ``write`` is false),
updates ``state`` in place and returns how many rows it produced (0 once the
schedule is complete).

:class:`ChunkedTable` runs the emitter once at construction, counting only,
and keeps a copy of ``state`` at the start of every chunk of about
:data:`CHUNK_ROWS` rows: a checkpoint of the checkpoint schedule.  Any chunk
is then regenerated on demand, forwards or backwards, from its own copy, in
``O(CHUNK_ROWS)`` time; the memory is one state per chunk (``O((c + r)
len / CHUNK_ROWS)`` words) instead of ``19 len`` bytes.  The rows are the
ones the same recursion writes into a whole table, since the emitter is
deterministic and a chunk boundary only pauses it between two units.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import VlccRuntimeError
from .actions import ACTION_DTYPE

__all__ = ["CHUNK_ROWS", "ChunkedTable", "concatenate"]

#: Rows per chunk (at most; a chunk ends where the next unit would not fit).
CHUNK_ROWS = 1 << 16


class ChunkedTable:
    """The rows of a resumable emitter, regenerated chunk by chunk.

    **Arguments:**

    - `fill`: ``fill(out, write, state, limit) -> rows`` (module docstring).
    - `state`: the emitter's initial state (copied, not modified).
    - `limit`: rows per chunk at most (default :data:`CHUNK_ROWS`).

    **Attributes:**

    - `starts`: ``int64`` array of the first row of each chunk, and the total
      number of rows as its last entry.
    """

    def __init__(self, fill: Callable, state: np.ndarray, limit: int | None = None):
        self._fill = fill
        self._limit = int(CHUNK_ROWS if limit is None else limit)
        state = np.array(state, np.int64)
        dummy = np.empty(1, ACTION_DTYPE)
        starts = [0]
        saved = []
        while True:
            before = state.copy()
            rows = int(fill(dummy, False, state, self._limit))
            if rows < 0:  # pragma: no cover - an emitter outgrew its state
                raise VlccRuntimeError(f"{fill!r} ran out of stack at row {starts[-1]}")
            if rows == 0:
                break
            saved.append(before)
            starts.append(starts[-1] + rows)
        self.starts = np.array(starts, np.int64)
        self._states = np.array(saved, np.int64).reshape(len(saved), len(state))

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def chunks(self) -> int:
        """The number of chunks."""
        return len(self.starts) - 1

    @property
    def nbytes(self) -> int:
        """Bytes held: the chunk starts and the emitter states."""
        return int(self.starts.nbytes + self._states.nbytes)

    def chunk(self, k: int) -> np.ndarray:
        """Rows ``starts[k] .. starts[k + 1] - 1``, a new read-only array."""
        out = np.empty(int(self.starts[k + 1] - self.starts[k]), ACTION_DTYPE)
        state = self._states[k].copy()
        rows = int(self._fill(out, True, state, self._limit))
        if rows != len(out):  # pragma: no cover - the emitter is deterministic
            raise VlccRuntimeError(f"chunk {k} regenerated {rows} rows, counted {len(out)}")
        out.flags.writeable = False
        return out


def concatenate(parts: list[np.ndarray]) -> np.ndarray:
    """Rows of contiguous tables, one after the other, in a new table.

    ``np.concatenate`` copies a packed structured dtype field by field,
    dozens of times slower than the bytes it moves; this copies the bytes.
    """
    if not parts:
        return np.empty(0, ACTION_DTYPE)
    raw = np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts])
    return raw.view(ACTION_DTYPE)
