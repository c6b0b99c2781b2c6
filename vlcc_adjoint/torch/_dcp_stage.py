"""One reusable host staging area for ``dcp.async_save``.

``dcp.async_save`` first *stages* the state dict (a copy that training may
no longer change), then writes the copy in the background.  DCP's default
stager allocates a fresh copy at every save, and pinned-memory variants
keep a second one: users see up to twice the rank's shard in host memory,
and on the virtual machines we measure, touching fresh pages makes the copy
2-5x slower than a copy into pages touched before (see
:mod:`vlcc_adjoint.storage._pool`).  After DataStates-LLM (Maurya et al.,
HPDC 2024: lazy copies into one reusable host cache), :class:`StagingArea`
keeps **one** flat byte buffer per writer:

- its size is the rank's shard, the sum of the bytes of its local tensors
  (a DTensor contributes its local shard), packed without gaps: tensors are
  placed in order of decreasing item size, so every offset is aligned to
  its tensor's item size with no padding at all (bound: 1.0x the shard;
  the buffer is reallocated only when it is too small or more than 1.25x
  what a save needs);
- every later save with the same layout copies into the same pages;
- a save's copy must not be overwritten while that save still writes from
  it: :meth:`StagingArea.stage` waits until the previous save released the
  area (:meth:`StagingArea.release`, called by the writer once its data is
  staged into the history), or until the previous staged state dict is
  gone (a save that failed before writing).

With ``background=True`` on the writer, the copy runs on a thread of the
area (:meth:`StagingArea.stage_in_background`): ``dcp.async_save`` then
returns DCP's ``AsyncSaveResponse`` at once, and training only has to wait
for ``staging_completion`` before it changes the weights (the optimizer
step), so the copy overlaps forward and backward, as DataStates-LLM's lazy
copies do.

The staged state dict has the structure of the original: a plain tensor
becomes a view of the buffer, a DTensor a DTensor over such a view (same
mesh, placements, global shape and stride), anything else a deep copy.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

__all__ = ["StagingArea"]

#: Reallocate the buffer when it exceeds what a save needs by more than this.
MAX_SLACK = 1.25


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return DTensor


#: Bytes of plain copies from which a save's copy is split between two threads.
PARALLEL_BYTES = 8 << 20


def _byte_copy(raw: torch.Tensor, view: torch.Tensor, src: torch.Tensor):
    """``(destination, source)``, the bytes of `src` and of `raw` (`view`'s bytes,
    as ``uint8``) as numpy arrays, when copying them is copying `src`; else ``None``.

    That is a contiguous CPU tensor whose bytes are its values (strided, not
    quantized, no conjugate or negative bit): copied as bytes by ``np.copyto``,
    one ``memcpy`` that releases the GIL, faster than ``Tensor.copy_`` on one
    torch thread (``copy_`` dispatches per dtype and splits the copy into
    TensorIterator blocks).  Any other tensor (on a device, strided views,
    conjugate views) goes through ``copy_``, which knows its semantics.
    """
    if (
        src.device.type == "cpu"
        and src.layout == torch.strided
        and not src.is_quantized
        and src.is_contiguous()
        and not src.is_conj()
        and not src.is_neg()
        and src.dtype == view.dtype
    ):
        return raw.numpy(), src.reshape(-1).view(torch.uint8).numpy()
    return None


def _halves(pairs: list[tuple[np.ndarray, np.ndarray]]):
    """`pairs` of equal-sized byte arrays ``(destination, source)`` cut into two
    lists of (nearly) equal bytes; the pair across the middle is split."""
    total = sum(d.size for d, _ in pairs)
    first: list[tuple[np.ndarray, np.ndarray]] = []
    second: list[tuple[np.ndarray, np.ndarray]] = []
    left = total // 2
    for d, src in pairs:
        if left >= d.size:
            first.append((d, src))
            left -= d.size
        elif left > 0:
            first.append((d[:left], src[:left]))
            second.append((d[left:], src[left:]))
            left = 0
        else:
            second.append((d, src))
    return first, second


def _copy_all(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for d, src in pairs:
        np.copyto(d, src)


class StagingArea:
    """A reusable host buffer into which ``stage`` copies a state dict's tensors.

    **Arguments:**

    - `timeout`: seconds :meth:`stage` waits for the previous save to release
      the area before it raises.
    """

    def __init__(self, timeout: float = 3600.0):
        self.timeout = float(timeout)
        self.buffer: torch.Tensor | None = None
        self.shard_bytes = 0
        self.saves = 0
        self.reallocations = 0
        self._free = threading.Event()
        self._free.set()
        self._staged: weakref.ref | None = None  # a view of the last staged state dict
        self._executor: ThreadPoolExecutor | None = None
        self._helper: ThreadPoolExecutor | None = None  # the second thread of a copy
        self.parallel_copies = 0  # saves whose copy was split between two threads

    @property
    def nbytes(self) -> int:
        """Bytes of the staging buffer (0 before the first save)."""
        return 0 if self.buffer is None else self.buffer.numel()

    def release(self) -> None:
        """Mark the area free: the save that staged into it no longer reads it."""
        self._free.set()

    def stage_in_background(self, state_dict: dict) -> Future:
        """:meth:`stage` on this area's copy thread; the future gives the staged dict.

        The caller must not change `state_dict`'s tensors until the future is
        done (in training: the copy overlaps forward and backward, and the
        optimizer step waits for it).
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vlcc-dcp-stage")
        return self._executor.submit(self.stage, state_dict)

    def close(self) -> None:
        """Stop the copy thread (if any) and free the buffer."""
        for executor in (self._executor, self._helper):
            if executor is not None:
                executor.shutdown(wait=True)
        self._executor = self._helper = None
        self.buffer = None

    def _wait_free(self) -> None:
        """Wait until the previous save released the area, or dropped its staged state
        dict (a save that failed before writing never calls :meth:`release`)."""
        deadline = time.monotonic() + self.timeout
        while not self._free.wait(0.05):
            if self._staged is None or self._staged() is None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the previous async_save of this VlccWriter still uses its staging area "
                    f"after {self.timeout:.0f} s; wait for that save's future (.result()) before "
                    "the next async_save, or give each concurrent save its own VlccWriter"
                )

    def stage(self, state_dict: dict) -> dict:
        """Copy `state_dict`'s tensors into the area; return the staged state dict."""
        self._wait_free()
        self._free.clear()
        try:
            return self._stage(state_dict)
        except BaseException:
            self._free.set()
            raise

    def _stage(self, state_dict: dict) -> dict:
        dtensor = _dtensor_type()
        tensors: list[torch.Tensor] = []

        def collect(obj):
            if isinstance(obj, torch.Tensor):
                local = obj.to_local() if dtensor is not None and isinstance(obj, dtensor) else obj
                tensors.append(local)
            elif isinstance(obj, dict):
                for v in obj.values():
                    collect(v)
            elif isinstance(obj, (list, tuple)):
                for v in obj:
                    collect(v)

        collect(state_dict)
        self._staged = None
        # Largest item size first: each offset is then a multiple of its item size.
        order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())
        offsets = [0] * len(tensors)
        total = 0
        for i in order:
            offsets[i] = total
            total += tensors[i].numel() * tensors[i].element_size()
        if self.buffer is None or self.nbytes < total or self.nbytes > MAX_SLACK * total:
            self.buffer = None  # the old pages go before the new ones are touched
            self.buffer = torch.empty(max(total, 1), dtype=torch.uint8)
            self.reallocations += 1
        self.shard_bytes = total
        self.saves += 1
        buf = self.buffer
        views = iter(range(len(tensors)))
        pairs: list[tuple[np.ndarray, np.ndarray]] = []  # byte copies, made below

        def copy_into(obj):
            if isinstance(obj, torch.Tensor):
                i = next(views)
                local = tensors[i]
                n = local.numel() * local.element_size()
                raw = buf[offsets[i] : offsets[i] + n]
                view = raw.view(local.dtype).view(local.shape)
                pair = _byte_copy(raw, view, local.detach()) if n else None
                if pair is not None:
                    pairs.append(pair)
                elif n:
                    view.copy_(local.detach())
                out = view
                if dtensor is not None and isinstance(obj, dtensor):
                    out = dtensor.from_local(
                        view,
                        obj.device_mesh,
                        obj.placements,
                        run_check=False,
                        shape=obj.shape,
                        stride=obj.stride(),
                    )
                if i == 0:  # the object in the staged dict: alive as long as the dict is
                    self._staged = weakref.ref(out)
                return out
            if isinstance(obj, dict):
                return (
                    type(obj)((k, copy_into(v)) for k, v in obj.items())
                    if type(obj) is not dict
                    else {k: copy_into(v) for k, v in obj.items()}
                )
            if isinstance(obj, list):
                return [copy_into(v) for v in obj]
            if isinstance(obj, tuple):
                return tuple(copy_into(v) for v in obj)
            return copy.deepcopy(obj)

        staged = copy_into(state_dict)
        self._copy(pairs)
        return staged

    def _copy(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Make the byte copies `pairs` (destination, source).

        From :data:`PARALLEL_BYTES` on, half of the bytes are copied by a
        helper thread of the area while the calling thread copies the other
        half: a memory copy is bound by one core's load and store rate well
        below the memory's, so two cores halve the time the caller is blocked
        (for the same CPU), where the machine has a core to spare.
        """
        if sum(d.size for d, _ in pairs) < PARALLEL_BYTES:
            _copy_all(pairs)
            return
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="vlcc-dcp-copy")
        first, second = _halves(pairs)
        other = self._helper.submit(_copy_all, second)
        try:
            _copy_all(first)
        finally:
            other.result()
        self.parallel_copies += 1

    def summary(self) -> dict[str, Any]:
        """``nbytes`` (buffer), ``shard_bytes`` (last save's tensors), ``saves``, ``reallocations``."""
        return {
            "nbytes": self.nbytes,
            "shard_bytes": self.shard_bytes,
            "saves": self.saves,
            "reallocations": self.reallocations,
        }
