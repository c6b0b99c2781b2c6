"""The checkpoint stores ``bench_dcp.py`` puts side by side, behind one small interface.

Each backend saves a training state dict (``{"model": ..., "optim": ...}``,
as ``torch.distributed.checkpoint.state_dict.get_state_dict`` returns it) as
version ``i`` and loads version ``i`` back:

- ``vlcc``: ``dcp.save(sd, storage_writer=VlccWriter(repo))``: every save a
  version of one lineage ``History`` (chunks deduplicated across versions);
  ``vlcc_deltas`` the same in a repository created with ``deltas=True``
  (changed chunks stored as compressed XOR against the parent's);
  ``vlcc_durable`` the same with ``VlccWriter(repo, durable=True)`` (every
  file and directory a save writes fsynced before the version is visible).
- ``dcp_fs``: DCP's default ``FileSystemWriter``/``FileSystemReader``, one
  directory per version (what ``dcp.save(sd, checkpoint_id=dir)`` does),
  with its default ``sync_files=True`` (every file fsynced);
  ``dcp_fs_nosync`` the same with ``sync_files=False``.
- ``icechunk``: icechunk 1.1, the versioned zarr store (copy-on-write
  chunks): one zarr array per tensor (raw, 1 MiB chunks like ours), every
  tensor written at every version, one ``commit`` per version; non-tensor
  entries (AdamW's hyper-parameters) as JSON attributes.
  ``icechunk_changed`` writes only the tensors whose bytes changed since the
  previous version (the best a user who tracks changes can do with it).

Each backend's ``fsync`` says whether its saves fsync what they write (the
results record it beside each backend's times): compare durable with
durable (``vlcc_durable`` with ``dcp_fs``) and page cache with page cache
(``vlcc`` with ``dcp_fs_nosync``).  icechunk's local store is left as
shipped.
"""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

MIB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def flatten(sd, prefix: str = "") -> tuple[dict, dict]:
    """``(tensors, other)``: a nested state dict's tensors and JSON values by dotted path."""
    tensors, other = {}, {}
    items = sd.items() if isinstance(sd, dict) else enumerate(sd)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            tensors[key] = v
        elif isinstance(v, (dict, list, tuple)) and any(
            isinstance(x, (torch.Tensor, dict)) for x in (v.values() if isinstance(v, dict) else v)
        ):
            t, o = flatten(v, key + "/")
            tensors.update(t)
            other.update(o)
        else:
            other[key] = v
    return tensors, other


def _chunks(shape: tuple, itemsize: int) -> tuple:
    """Row bands of about 1 MiB (the chunking our History uses)."""
    if not shape:
        return ()
    row = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    return (max(1, min(shape[0], MIB // max(row, 1))),) + tuple(shape[1:])


class VlccBackend:
    name = "vlcc"

    def __init__(
        self, root: str, deltas: bool = False, ids: list | None = None, durable: bool = False
    ):
        from vlcc_adjoint.torch.dcp import VlccWriter

        self.root, self.ids = root, list(ids or [])
        self.fsync = durable
        if deltas:
            self.name = "vlcc_deltas"
        if durable:
            self.name = "vlcc_durable"
        # one writer for the series (as a training loop would): it keeps the History open
        # and reuses one staging area under dcp.async_save
        self._writer = VlccWriter(root, branch="main", deltas=deltas, durable=durable)

    def save(self, sd: dict, i: int) -> None:
        self._writer.message = f"v{i}"
        dcp.save(sd, storage_writer=self._writer)
        self.ids.append(self._writer.version)

    def load(self, i: int, template: dict) -> dict:
        from vlcc_adjoint.torch.dcp import VlccReader

        dcp.load(template, storage_reader=VlccReader(self.root, ref=self.ids[i]))
        return template

    def writer(self, step: int):
        self._writer.message, self._writer.step = f"step {step}", step
        return self._writer

    def close(self) -> None:
        self._writer.close()


class FileSystemBackend:
    name = "dcp_fs"

    def __init__(self, root: str, ids: list | None = None, sync_files: bool = True):
        self.root = root
        self.fsync = sync_files
        if not sync_files:
            self.name = "dcp_fs_nosync"

    def _dir(self, i: int) -> str:
        return os.path.join(self.root, f"v{i}")

    @property
    def ids(self) -> list:
        return sorted(int(d[1:]) for d in os.listdir(self.root) if d.startswith("v"))

    def save(self, sd: dict, i: int) -> None:
        dcp.save(sd, storage_writer=self.writer(i))

    def load(self, i: int, template: dict) -> dict:
        dcp.load(template, storage_reader=dcp.FileSystemReader(self._dir(i)))
        return template

    def writer(self, step: int):
        return dcp.FileSystemWriter(self._dir(step), sync_files=self.fsync)

    def close(self) -> None:
        pass


class IcechunkBackend:
    name = "icechunk"
    fsync = None  # as shipped: not a setting of its local store

    def __init__(self, root: str, changed_only: bool = False, ids: list | None = None):
        import icechunk

        self.root, self.changed_only, self.ids = root, changed_only, list(ids or [])
        if changed_only:
            self.name = "icechunk_changed"
        storage = icechunk.local_filesystem_storage(root)
        self.repo = (
            icechunk.Repository.open(storage) if ids else icechunk.Repository.create(storage)
        )
        self._last: dict[str, bytes] = {}

    def save(self, sd: dict, i: int) -> None:
        import zarr

        tensors, other = flatten(sd)
        session = self.repo.writable_session("main")
        root = zarr.open_group(store=session.store, mode="a")
        for key, t in tensors.items():
            a = t.detach().cpu().numpy()
            if self.changed_only:
                digest = a.tobytes()
                if self._last.get(key) == digest:
                    continue
                self._last[key] = digest
            if key in root:
                arr = root[key]
            else:
                arr = root.create_array(
                    key,
                    shape=a.shape,
                    dtype=a.dtype,
                    chunks=_chunks(a.shape, a.itemsize),
                    compressors=None,
                    fill_value=0,
                )
            arr[...] = a
        root.attrs["other"] = json.loads(json.dumps(other, default=list))
        self.ids.append(session.commit(f"v{i}"))

    def load(self, i: int, template: dict) -> dict:
        import zarr

        session = self.repo.readonly_session(snapshot_id=self.ids[i])
        root = zarr.open_group(store=session.store, mode="r")
        tensors, _ = flatten(template)
        for key, t in tensors.items():
            t.copy_(torch.from_numpy(np.asarray(root[key][...])).reshape(t.shape))
        return template

    def close(self) -> None:
        pass


def make(name: str, root: str, ids: list | None = None):
    """A backend by name (see the module docstring); with `ids`, an existing store whose
    versions 0, 1, ... are those ids (to load them)."""
    if name in ("vlcc", "vlcc_deltas", "vlcc_durable"):
        return VlccBackend(
            root, deltas=name == "vlcc_deltas", ids=ids, durable=name == "vlcc_durable"
        )
    if name in ("dcp_fs", "dcp_fs_nosync"):
        return FileSystemBackend(root, ids, sync_files=name == "dcp_fs")
    if name in ("icechunk", "icechunk_changed"):
        return IcechunkBackend(root, changed_only=name == "icechunk_changed", ids=ids)
    raise ValueError(f"unknown backend {name!r}")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} line (Linux only)")


def reset_peak_rss() -> None:
    """Reset the kernel's record of this process's peak resident set size (``VmHWM``) to
    its resident set size now (Linux: ``5`` written to ``/proc/self/clear_refs``), so the
    next :func:`peak_rss_above` sees only what comes after."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_above(start: int) -> int:
    """The peak resident set size since :func:`reset_peak_rss` (``VmHWM``) above `start`."""
    return max(0, _status("VmHWM") - start)


def rss() -> int:
    """The process's resident set size now, in bytes."""
    return _rss()


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0
