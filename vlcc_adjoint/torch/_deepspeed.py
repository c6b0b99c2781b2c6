"""VlccCheckpointEngine: DeepSpeed's checkpoint engine, writing into a lineage History.

DeepSpeed hands every checkpoint file of ``model_engine.save_checkpoint`` to
``engine.checkpoint_engine.save(state_dict, path)``.  This engine commits the
state dict as a version of a :class:`vlcc_adjoint.lineage.History`
(asynchronously: content-addressed, deduplicated chunks written by a
background thread) and leaves at ``path`` a small JSON *pointer* naming the
version, because DeepSpeed looks for the files on disk (``glob``, ``isfile``)
before it calls ``load``.  Two lines::

    model_engine, optimizer, _, _ = deepspeed.initialize(...)
    VlccCheckpointEngine.attach(model_engine)          # history in <save_dir>/vlcc-history
    ...
    model_engine.save_checkpoint("ckpt")               # unchanged
    model_engine.load_checkpoint("ckpt")               # unchanged

(``model_engine.checkpoint_engine = VlccCheckpointEngine()`` works too; ``attach``
also names the tensors only the optimizer step changes: deferred capture, below.)

When the training loop is blocked
---------------------------------

The engine declares itself *decoupled* (``is_decoupled() == True``).
DeepSpeed then does not call ``commit`` at the end of ``save_checkpoint``
but at the next ``model_engine.step()``, right before the optimizer updates
the weights.  So:

* ``save`` only *captures*: with ``defer=False`` it copies the state's
  tensors into reused buffers (``History(capture="copy")``), a memory
  copy; with ``defer=True`` (the default after ``attach``) it copies now
  only the tensors the next forward pass may change (BatchNorm statistics,
  anything that is not a parameter or optimizer state) and hands the rest
  to a capture thread that reads them while the next forward and backward
  passes run (they read the weights, they do not write them: the snapshot
  of CheckFreq, Mohan et al., FAST 2021).  With ``wait_on_commit="captured"``
  (the default) that thread hashes and writes them, leaf by leaf, straight
  from the live tensors, without a copy (``History.stage``);
* ``commit(info)``, at the next optimizer step, makes sure the step may
  overwrite the weights.  With ``"captured"`` it writes the live leaves the
  capture thread has not claimed yet itself, leaf by leaf alongside that
  thread, and returns when they are written; the owned copies and the
  publication follow in the background.  A checkpoint costs one hash and
  one write of its bytes, however early the step comes, and no copy
  (``_stream``, ``_freeze``).  With ``copy_on_commit=True`` it copies those
  leaves instead, into buffers reused from commit to commit, and the thread
  writes the copies behind the training loop: the step waits for a memory
  copy instead of writes, for the CPU of the copy.  With ``"written"`` the
  step waits until the versions are on disk;
* ``latest`` is written by this engine, once the tag's versions are
  published on disk (``get_commit_info`` hands DeepSpeed a copy of the
  commit info with ``save_latest=False``, so DeepSpeed does not write it
  earlier): after a crash, ``latest`` names a checkpoint that is complete,
  at worst the one before the last.

The training loop is blocked for the capture in ``save`` (with ``defer=True`` only
the eager small tensors) plus, at the next step, with ``"captured"``, the writes of
the live leaves not yet written, shared by two threads (none when the forward and
backward passes took longer than the write; with ``copy_on_commit``, the write of
the leaf in progress and a copy of the others), with ``"written"`` what is left of
the whole write.  By default no byte is copied that the step could change: the
CPU of DeepSpeed's default engine, which copies the state (``clone``) and blocks
for the whole write in ``save_checkpoint`` (``benchmarks/bench_training.py``).  With
``defer=False`` and ``"captured"``, ``save`` copies the whole state
(``History(capture="copy")``) and the History's writer thread hashes and writes it.

Several processes
-----------------

The ranks of a job open one History together (its creation tolerates
concurrent creators).  DeepSpeed calls ``create`` and ``commit`` on every
rank; there the ranks agree (one all-gather of a flag): a history that one
rank cannot open, or a capture that failed on one rank, raises on every rank,
naming the failed ranks, instead of leaving the others waiting in DeepSpeed's
next collective.  The capture and publish threads are joined at interpreter
exit when the engine was never closed (see :func:`_close_at_exit`).

Loading never unpickles: ``load(path)`` reads the pointer (JSON), opens the
History and rebuilds the state from its zarr chunks with the torch state
provider (:mod:`vlcc_adjoint.torch._state`).  The DeepSpeed objects of ZeRO
stages 0-3 checkpoints (loss scalers, ``fragment_address``,
``ZeroStageEnum``) are stored as plain data and rebuilt from an allow-list
(:mod:`vlcc_adjoint.torch._deepspeed_state`); ``tests/torch/test_deepspeed_zero.py``
checks every stage against DeepSpeed's ``torch.save`` engine: the files'
contents, the reloaded weights and optimizer state bit for bit, and the
losses after resuming.  A file that is not a pointer
(a ``torch.save`` file) is refused with a message saying how to read it
with pickle if it is trusted.

Without DeepSpeed the engine is an asynchronous, versioned ``torch.save``:
``save(state_dict, path)``, ``commit(...)``, ``load(path)``, ``wait()``,
``close()``; :meth:`guard` installs the commit-before-update hook on a
plain ``torch.optim.Optimizer``.
"""

from __future__ import annotations

import atexit
import collections
import copy
import dataclasses
import itertools
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import state as _vstate
from ..errors import VlccFileNotFoundError, VlccRuntimeError, VlccTypeError, VlccValueError
from ..storage import BufferPool, CorruptCheckpointError
from ..storage import format as SF
from ._deepspeed_state import register_deepspeed_providers
from ._state import register_providers

if TYPE_CHECKING:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo
    from deepspeed.runtime.engine import DeepSpeedEngine

    from ..lineage import History
    from ..storage.codecs import Codec

__all__ = ["VlccCheckpointEngine"]

POINTER_FORMAT = "vlcc-deepspeed-pointer/1"
#: Target raw bytes of a chunk in a History this engine opens (``chunk_bytes``).
#: A training checkpoint changes every weight and every optimizer moment at every
#: step, so the content addressing of 1 MiB chunks (the History's default) finds
#: nothing to share between versions while each chunk costs a scratch file, two
#: hard links and an unlink (measured: 48 files of 1 MiB cost ~25% more CPU to
#: write than one file of 48 MiB).  At 16 MiB that per-file cost is below 2% of
#: the write, an unchanged leaf (a frozen layer) still deduplicates whole, and a
#: read still allocates at most one chunk at a time.  The chunk grid is recorded
#: per leaf in the version's manifest: any reader reads any chunk size.
CHUNK_BYTES = 16 << 20
_POINTER_MAX = 64 << 10  # a pointer is a few hundred bytes; refuse to parse more


class _Job:
    """One file of a checkpoint (one ``save``) on its way into the history.

    `state` is ``(spec, leaves, live)`` while the capture thread works on it:
    ``live[i]`` says that ``leaves[i]`` is still the training's own tensor
    (a parameter or optimizer state, deferred), else an owned copy.  A
    *streamed* job (``wait_on_commit="captured"`` with deferred capture) is
    written leaf by leaf from the live tensors, live leaves first
    (`order`), into `entries` (leaf index -> ``History.stage`` entry).  A
    writer *claims* the next leaf of `order` under the engine's lock
    (`position` counts the leaves claimed); `inflight` counts the live
    leaves claimed and not yet written.  `frozen` is set by the commit,
    which then either writes the live leaves not yet claimed itself,
    alongside the capture thread, or (``copy_on_commit``) copies them into
    `copies` (leaf index -> buffer); then it sets `captured`.
    """

    __slots__ = (
        "state",
        "path",
        "tag",
        "message",
        "meta",
        "vid",
        "done",
        "error",
        "streamed",
        "order",
        "position",
        "inflight",
        "entries",
        "frozen",
        "copies",
        "captured",
        "abandoned",
    )

    def __init__(self, state, path, tag, message, meta, streamed: bool = False):
        self.state = state
        self.path = path
        self.tag = tag
        self.message = message
        self.meta = meta
        self.vid: str | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.streamed = streamed
        self.order: list[int] = []
        if streamed:
            live = state[2]
            self.order = [i for i, x in enumerate(live) if x] + [
                i for i, x in enumerate(live) if not x
            ]
        self.position = self.inflight = 0
        self.entries: list[Any] = [None] * len(state[1]) if streamed else []
        self.frozen = False
        self.copies: dict[int, np.ndarray] = {}
        self.captured = threading.Event()
        self.abandoned = False


class VlccCheckpointEngine:
    """A DeepSpeed checkpoint engine that commits into a lineage ``History``.

    **Arguments:**

    - `history`: a :class:`vlcc_adjoint.lineage.History`, or the path of one
      (created if missing); default ``<save_dir>/vlcc-history`` of the first
      ``save_checkpoint``.
    - `config_params`: DeepSpeed passes its config to engines; unused.
    - `model`, `optimizer`: the module and optimizer whose parameters and
      optimizer state only the optimizer step changes (``attach`` sets them
      from the DeepSpeed engine); needed for `defer`.
    - `defer`: capture parameters and optimizer state in the background,
      during the next forward/backward pass (default: when `model` or
      `optimizer` is given).
    - `wait_on_commit`: ``"captured"`` (commit waits until the state is
      safe from the optimizer step: the live tensors written or copied; the
      rest continues in the background) or ``"written"`` (until the versions
      are on disk).  With `defer`, both write from the live tensors;
      ``"captured"`` writes at the commit what is not written by then, on the
      committing thread alongside the capture thread.
    - `copy_on_commit`: with ``"captured"`` and `defer`, the commit copies the
      live tensors not written yet (into buffers reused from commit to commit)
      instead of writing them, and the capture thread writes the copies behind
      the step: the step waits for a memory copy rather than for writes, for
      the CPU of that copy (see :meth:`_freeze`).  Default ``False``.
    - `chunk_bytes`, `codec`, `durable`: passed to a ``History`` this engine
      opens.  `chunk_bytes` defaults to :data:`CHUNK_BYTES` (16 MiB: few, large
      files; see there); `codec` to ``None``: raw chunks (the mantissas of
      trained float weights and moments are nearly random: lossless compression
      saves little space for a pass of CPU over every byte).

    DeepSpeed's interface: ``create``, ``save``, ``load``, ``commit``,
    ``makedirs``, ``is_data_parallel_writer``, ``is_decoupled``,
    ``set_commit_info``, ``get_commit_info``, ``cleanup``,
    ``preserves_storage_sharing``.
    """

    def __init__(
        self,
        history: History | str | os.PathLike | None = None,
        config_params: Any = None,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        defer: bool | None = None,
        wait_on_commit: str = "captured",
        copy_on_commit: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
        codec: Codec | None = None,
        durable: bool = False,
    ) -> None:
        register_providers()
        if "deepspeed" in sys.modules:
            register_deepspeed_providers(import_modules=True)
        if wait_on_commit not in ("written", "captured"):
            raise VlccValueError(
                f"wait_on_commit must be 'written' or 'captured', got {wait_on_commit!r}"
            )
        if defer is None:
            defer = model is not None or optimizer is not None
        if defer and model is None and optimizer is None:
            raise VlccValueError(
                "defer=True needs model= and/or optimizer= (the tensors only the "
                "optimizer step changes); use VlccCheckpointEngine.attach("
                "model_engine), or defer=False"
            )
        self.name = "VlccCheckpointEngine"
        self.model = model
        self.optimizer = optimizer
        self.defer = bool(defer)
        self.wait_on_commit = wait_on_commit
        self.copy_on_commit = bool(copy_on_commit)
        self._history_opts: dict[str, Any] = dict(
            chunk_bytes=chunk_bytes, codec=codec, durable=durable, capture="copy"
        )
        self._history: History | None = None
        self._history_path: str | None = None
        self._own_history = False
        if history is not None and not isinstance(history, (str, os.PathLike)):
            self._history = history
            self._history_path = history.path
        elif history is not None:
            self._history_path = os.path.abspath(os.fspath(history))
        self._readers: dict[str, History] = {}
        self._info = None
        self._ds_info = None
        mutex = threading.RLock()  # one lock, two conditions on it
        self._lock = threading.Condition(mutex)
        self._jobs: collections.deque = collections.deque()
        self._pending: list[_Job] = []  # jobs of the tag being saved (for commit)
        self._thread: threading.Thread | None = None
        self._publish: collections.deque = collections.deque()  # (info, jobs) to publish
        self._publisher: threading.Thread | None = None
        self._published = threading.Condition(mutex)
        self._latest_seq = itertools.count()
        self._latest_done = -1
        self._closed = False
        self._error: BaseException | None = None
        self._hooks: list[Any] = []  # torch hook handles (removed on close)
        # Buffers of the copies a commit makes of leaves not written yet (see
        # _stream); reused by the next commit's copies (fresh pages are slow).
        self._copies = BufferPool(0)
        self.timings: collections.defaultdict[str, float] = collections.defaultdict(float)
        # seconds spent in save and waiting in commit ("save", "commit_wait")
        self._finalizer = weakref.finalize(self, _shutdown, self._lock, self._jobs, self._publish)
        if "deepspeed" in sys.modules:  # a virtual subclass of DeepSpeed's ABC
            try:
                from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

                CheckpointEngine.register(VlccCheckpointEngine)
            except Exception:  # pragma: no cover - another DeepSpeed layout
                pass

    # -- setup -----------------------------------------------------------------------

    @classmethod
    def attach(
        cls,
        model_engine: DeepSpeedEngine,
        history: History | str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> VlccCheckpointEngine:
        """Make a new engine ``model_engine.checkpoint_engine`` (a DeepSpeed engine).

        Passes the engine's module and optimizer (so parameters and optimizer
        state are captured in the background, see the module docstring) and
        `history` and `kwargs` to the constructor.  Returns the new engine.
        """
        kwargs.setdefault("model", getattr(model_engine, "module", None))
        opt = getattr(model_engine, "optimizer", None)
        kwargs.setdefault("optimizer", opt)
        engine = cls(history, **kwargs)
        model_engine.checkpoint_engine = engine
        return engine

    def guard(self, optimizer: torch.optim.Optimizer) -> None:
        """For plain PyTorch loops: commit pending checkpoints before every
        ``optimizer.step()`` (a step pre-hook), as DeepSpeed does for a
        decoupled engine."""
        if not hasattr(optimizer, "register_step_pre_hook"):
            raise VlccTypeError(
                f"{type(optimizer).__name__} has no register_step_pre_hook; call "
                "engine.commit() yourself before the optimizer step"
            )
        self._hooks.append(optimizer.register_step_pre_hook(lambda *a, **k: self._commit_hook()))

    def history(self) -> History:
        """The ``History`` this engine writes to (opened on first use)."""
        if self._history is None:
            if self._history_path is None:
                raise VlccRuntimeError(
                    "VlccCheckpointEngine: no history path yet; pass history= or "
                    "call create(info) (DeepSpeed does, in save_checkpoint)"
                )
            from ..lineage import History

            os.makedirs(self._history_path, exist_ok=True)
            self._history = History(self._history_path, **self._history_opts)
            self._own_history = True
        return self._history

    # -- DeepSpeed's interface ----------------------------------------------------------

    def create(self, info: CheckpointCommitInfo) -> None:
        """A checkpoint (``info.tag`` in ``info.save_dir``) is about to be saved."""
        self._raise_error()
        if self._info is not None and self._pending:
            self._commit(self._info, agree=False)  # a previous tag was never committed
        self._info = info
        self._ds_info = None
        if self._history_path is None:
            self._history_path = os.path.abspath(os.path.join(info.save_dir, "vlcc-history"))
        # Every rank calls create: open the history here, so that a rank that
        # cannot stops every rank (a rank failing alone would leave the others
        # waiting in DeepSpeed's next collective).
        error: BaseException | None = None
        try:
            self.history()
        except Exception as err:
            error = err
        _agree(error, f"opening the history {self._history_path}")

    def makedirs(self, path: str | os.PathLike, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        """Capture `state_dict` as a version of the history; leave a pointer at `path`."""
        t0 = time.perf_counter()
        self._raise_error()
        if self._closed:
            raise VlccRuntimeError("VlccCheckpointEngine is closed")
        if "deepspeed" in sys.modules:  # DeepSpeed may have been imported after __init__
            register_deepspeed_providers(import_modules=True)
        tag = getattr(self._info, "tag", None)
        path = os.path.abspath(os.fspath(path))
        if self._history_path is None:
            self._history_path = os.path.join(os.path.dirname(path), "vlcc-history")
        history = self.history()
        name = os.path.basename(path)
        message = f"{tag}/{name}" if tag is not None else name
        meta = {"deepspeed_tag": tag, "file": name}
        if isinstance(state_dict, dict):
            for key in ("global_steps", "global_samples", "skipped_steps"):
                if isinstance(state_dict.get(key), int):
                    meta[key] = state_dict[key]
        if not self.defer:
            if self.wait_on_commit == "written":
                leaves, spec = _vstate.flatten(state_dict)
                vid = self._store(spec, leaves, message, meta)
            else:
                vid = history.commit(state_dict, message=message, meta=meta)
            self._write_pointer(path, vid, tag)
            job = _Job(None, path, tag, message, meta)
            job.vid = vid
            job.done.set()
        else:
            streamed = self.wait_on_commit == "captured"
            job = _Job(self._split(state_dict), path, tag, message, meta, streamed)
            with self._lock:
                self._jobs.append(job)
                if self._thread is None:
                    _close_at_exit(self)
                    self._thread = threading.Thread(
                        target=self._capture_loop, name="vlcc-ds-capture", daemon=True
                    )
                    self._thread.start()
                self._lock.notify_all()
        self._pending.append(job)
        self.timings["save"] += time.perf_counter() - t0

    def load(self, path: str, map_location: str | torch.device | Callable | None = None) -> Any:
        """The state dict saved at `path` (a pointer written by :meth:`save`).

        `map_location`: a device (or its name) to move tensors to; DeepSpeed's
        callables (``lambda storage, loc: storage``) and ``None`` leave them on
        the CPU.
        """
        self._raise_error()
        path = os.path.abspath(os.fspath(path))
        pointer = self.read_pointer(path)
        hist_path = os.path.normpath(os.path.join(os.path.dirname(path), pointer["history"]))
        history = self._reader(hist_path)
        try:
            try:
                state = history.load(pointer["version"])
            except _vstate.UnknownStateTypeError as err:
                # A DeepSpeed object (loss scaler, ...) and DeepSpeed not imported
                # yet: import the allow-listed modules, once, and read again.
                if "'deepspeed." not in str(err) or not register_deepspeed_providers(True):
                    raise
                state = history.load(pointer["version"])
        except KeyError as err:
            raise VlccFileNotFoundError(
                f"{path} points to version {pointer['version']} of the history at {hist_path}, "
                "which is not there: the checkpoint was still being written when the process "
                "ended (load an earlier tag) or the history was garbage-collected"
            ) from err
        if isinstance(map_location, (str, torch.device)):
            device = torch.device(map_location)
            state = _map_tensors(state, lambda t: t.to(device))
        return state

    def commit(self, info: CheckpointCommitInfo | None = None) -> bool:
        """Wait until the pending checkpoints are captured (and, with
        ``wait_on_commit="written"``, on disk); then ``latest`` is written
        (when ``info.save_latest``) as soon as they are on disk.  DeepSpeed
        calls it before the optimizer step, on every rank.

        Under DeepSpeed (after :meth:`create`) in a process group of several
        ranks, the ranks agree here: a capture that failed on any rank raises
        on every rank (one all-gather of a flag), so no rank trains on while
        another stopped."""
        return self._commit(info, agree=self._info is not None)

    def _commit(self, info: CheckpointCommitInfo | None, agree: bool) -> bool:
        t0 = time.perf_counter()
        if info is None or info is self._ds_info:
            info = self._info
        jobs, self._pending = self._pending, []
        self._freeze(jobs)
        for job in jobs:
            (job.captured if job.streamed else job.done).wait()
        if agree:
            with self._lock:
                error, self._error = self._error, None
            _agree(error, "capturing the checkpoint")
        self._raise_error()
        if jobs:
            item = (next(self._latest_seq), info, jobs)
            if self.wait_on_commit == "written":
                self._publish_now(*item)
            else:
                with self._lock:
                    self._publish.append(item)
                    if self._publisher is None:
                        _close_at_exit(self)
                        self._publisher = threading.Thread(
                            target=self._publish_loop, name="vlcc-ds-publish", daemon=True
                        )
                        self._publisher.start()
                    self._lock.notify_all()
        self._info = self._ds_info = None
        self.timings["commit_wait"] += time.perf_counter() - t0
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return True

    def set_commit_info(self, info: CheckpointCommitInfo) -> None:
        self._info = info

    def get_commit_info(self) -> CheckpointCommitInfo | None:
        """The pending commit, as DeepSpeed reads it before calling ``commit``:
        a copy with ``save_latest=False`` (this engine writes ``latest`` itself,
        once the checkpoint is on disk)."""
        if self._info is None:
            return None
        if self._ds_info is None:
            try:
                self._ds_info = dataclasses.replace(self._info, save_latest=False)
            except TypeError:
                self._ds_info = copy.copy(self._info)
                self._ds_info.save_latest = False
        return self._ds_info

    def preserves_storage_sharing(self) -> bool:
        # False: DeepSpeed then hands over its live tensors instead of cloning
        # them first (the capture here copies what it needs, once).
        return False

    def cleanup(self) -> None:
        """Commit what is pending, finish the writes, close what this engine opened."""
        self.close()

    # -- beyond DeepSpeed ---------------------------------------------------------------

    def wait(self) -> None:
        """Block until every checkpoint saved so far is committed, captured and
        written (and ``latest`` updated)."""
        if self._pending:
            self._commit(self._info, agree=False)
        with self._lock:
            jobs = [j for j in self._jobs if j is not None]
        for job in jobs + self._pending:
            job.done.wait()
        self._raise_error()
        if self._history is not None:
            self._history.wait()
        with self._lock:
            while self._publish and self._publisher is not None and self._error is None:
                self._published.wait(0.05)
        self._raise_error()

    def close(self) -> None:
        """Commit pending checkpoints, wait for the writes, stop the threads,
        close the histories this engine opened.  Idempotent."""
        if self._closed:
            return
        try:
            if self._pending:
                self._commit(self._info, agree=False)
            self.wait()
        finally:
            self._closed = True
            for h in self._hooks:
                h.remove()
            self._finalizer()
            for th in (self._thread, self._publisher):
                if th is not None:
                    th.join()
            self._copies.close()
            if self._own_history and self._history is not None:
                self._history.close()
            for reader in self._readers.values():
                if reader is not self._history:
                    reader.close()
            self._readers.clear()

    @staticmethod
    def read_pointer(path: str) -> dict:
        """The pointer JSON at `path`, validated; a clear error for anything else.

        Read through the format layer: a link or anything but a regular file
        is refused (``CorruptCheckpointError`` naming it), at most 64 KiB are
        read, and the text must be strict JSON; a file that is no pointer
        (too large, or a ``torch.save`` pickle) raises ``ValueError`` naming
        it and what to do.
        """
        fd = SF.open_regular(path)
        try:
            raw = os.read(fd, _POINTER_MAX + 1)
        finally:
            os.close(fd)
        try:
            if len(raw) > _POINTER_MAX:
                raise VlccValueError(f"it has more than {_POINTER_MAX} bytes")
            doc = SF.parse_json(raw, path)
            if not (
                isinstance(doc, dict)
                and doc.get("format") == POINTER_FORMAT
                and isinstance(doc.get("history"), str)
                and isinstance(doc.get("version"), str)
            ):
                raise VlccValueError("not a vlcc pointer")
        except (ValueError, CorruptCheckpointError):
            hint = ""
            if raw[:2] == b"PK" or raw[:1] == b"\x80":
                hint = (
                    " It looks like a torch.save (pickle) file: if you trust it, read it "
                    "with torch.load(path, weights_only=True) or DeepSpeed's "
                    "TorchCheckpointEngine; VlccCheckpointEngine never unpickles."
                )
            raise VlccValueError(
                f"{path} is not a checkpoint pointer written by "
                f"VlccCheckpointEngine (format {POINTER_FORMAT}).{hint}"
            ) from None
        return doc

    # -- internals -----------------------------------------------------------------------

    def _commit_hook(self) -> None:
        if self._pending:
            self._commit(None, agree=False)

    def _write_pointer(self, path: str, vid: str, tag) -> None:
        rel = os.path.relpath(self.history().path, os.path.dirname(path))
        doc = {
            "format": POINTER_FORMAT,
            "history": rel,
            "version": vid,
            "tag": tag,
            "note": "a VlccCheckpointEngine checkpoint: the state is version `version` "
            "of the vlcc lineage History at `history` (relative to this file)",
        }
        SF.write_atomic(path, json.dumps(doc, indent=1).encode(), durable=False)

    def _reader(self, hist_path: str):
        if self._history is not None and os.path.abspath(self._history.path) == hist_path:
            return self._history
        reader = self._readers.get(hist_path)
        if reader is None:
            from ..lineage import History

            reader = History(hist_path, mode="r")
            self._readers[hist_path] = reader
        return reader

    def _deferrable(self) -> set[int]:
        """Data pointers of tensors only the optimizer step changes.

        The module's parameters, and, for the optimizer and every optimizer it
        wraps (DeepSpeed's ZeRO optimizers wrap a ``torch.optim`` one in
        ``.optimizer``), its state tensors (Adam's moments) and the parameters
        of its ``param_groups``: a ZeRO optimizer's inner optimizer steps the
        fp32 master partitions (``single_partition_of_fp32_groups``, saved in
        the optimizer's file), which no forward or backward pass writes.
        """
        ptrs = set()
        if self.model is not None:
            for p in self.model.parameters():
                ptrs.add(p.data_ptr())
        opt = self.optimizer
        while opt is not None:
            tensors: list[Any] = []
            for st in getattr(opt, "state", {}).values():
                if isinstance(st, dict):
                    tensors.extend(st.values())
            for group in getattr(opt, "param_groups", None) or ():
                if isinstance(group, dict) and isinstance(group.get("params"), list):
                    tensors.extend(group["params"])
            for v in tensors:
                if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                    ptrs.add(v.data_ptr())
            inner = getattr(opt, "optimizer", None)
            opt = inner if inner is not opt else None
        ptrs.discard(0)
        return ptrs

    def _split(self, state_dict):
        """``(spec, leaves, live)``: the state with every tensor the next forward
        pass might change copied now, the others (parameters, optimizer state)
        still live (``live[i]``)."""
        leaves, spec = _vstate.flatten(state_dict)
        deferrable = self._deferrable()
        mixed = []
        live = []
        for leaf in leaves:
            ptr = leaf.__array_interface__["data"][0] if leaf.size else 0
            live.append(ptr in deferrable)
            mixed.append(leaf if live[-1] else np.array(leaf, copy=True))
        return spec, mixed, live

    def _capture_loop(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._lock.wait()
                job = self._jobs[0]
            if job is None:
                return
            try:
                if job.streamed:
                    job.vid = self._stream(job)
                else:
                    spec, leaves, _ = job.state
                    job.vid = self._store(spec, leaves, job.message, job.meta)
                self._write_pointer(job.path, job.vid, job.tag)
            except BaseException as err:  # raised by the next call of the engine
                job.error = err
                with self._lock:
                    self._error = err
            finally:
                with self._lock:
                    job.state = None
                    self._jobs.popleft()
                    self._lock.notify_all()
                job.captured.set()
                job.done.set()

    def _store(self, spec: dict, leaves: list, message: str, meta: dict) -> str:
        """Make `leaves` (with `spec`, as :func:`vlcc_adjoint.state.flatten` gives
        them) a version of the history; its id.

        With ``wait_on_commit="captured"`` the History copies the leaves
        (``capture="copy"``) and hashes and writes the copy in the background.
        With ``"written"`` the optimizer step waits until the version is on disk
        anyway, so the copy would buy nothing: the chunks are hashed and written
        straight from the leaves (``History.stage``, then ``commit_staged``), one
        pass over the bytes fewer.
        """
        history = self.history()
        if self.wait_on_commit == "written":
            entries = history.stage(leaves)
            return history.commit_staged(spec, entries, message, meta)
        return history.commit(_vstate.unflatten(spec, leaves), message=message, meta=meta)

    def _stream(self, job: _Job) -> str:
        """Write a streamed job's leaves into the history and commit them as one
        version; its id (the capture thread).

        The live leaves go first, each hashed and written straight from the
        training's tensor (``History.stage``: no copy) while the forward and
        backward passes run.  When the commit comes (the optimizer step is
        about to change the weights) before they are all written, the live
        leaves left are captured by :meth:`_freeze`: written by the committing
        thread alongside this one (by default), or copied, and this thread
        writes the copies (``copy_on_commit``).  So a checkpoint costs the CPU
        of one hash and one write of its bytes, plus, with ``copy_on_commit``,
        a copy of what the forward and backward passes did not cover.  The
        owned leaves follow; then, once every leaf is written (by either
        thread), the version is published (``History.commit_staged``).
        """
        history = self.history()
        spec, leaves, live = job.state
        while True:
            with self._lock:
                if job.abandoned:
                    break
                if job.position == len(job.order):
                    while job.inflight:  # a leaf the commit is writing
                        self._lock.wait()
                    break
                k = job.order[job.position]
                job.position += 1
                copied = job.frozen and self.copy_on_commit and live[k]
                if live[k] and not copied:
                    job.inflight += 1
            if copied:
                job.captured.wait()  # until the commit has copied it
                if job.abandoned:
                    break
                self._write_leaf(history, job, k, leaves[k], live=False)
                buf = job.copies.pop(k, None)
                if buf is not None:
                    leaves[k] = None
                    self._copies.recycle([buf])  # written: the next commit's copies reuse it
            else:
                self._write_leaf(history, job, k, leaves[k], live=live[k])
        if job.abandoned or any(e is None for e in job.entries):
            raise VlccRuntimeError(
                "VlccCheckpointEngine: the commit could not write or copy the leaves "
                "not written yet (see its error); that checkpoint was not stored"
            )
        return history.commit_staged(spec, job.entries, job.message, job.meta)

    def _write_leaf(
        self, history: History, job: _Job, k: int, leaf: np.ndarray, live: bool
    ) -> None:
        """Stage `leaf`, leaf `k` of `job` (claimed by the calling thread), into
        ``job.entries``.

        For a live leaf (counted in ``job.inflight`` by the claim) the count is
        released once it is written; if the write fails, the job is abandoned
        first (under the lock: a thread waiting for the count sees it), so that
        no version without that leaf is published."""
        try:
            entry = history.stage([leaf])[0]
        except BaseException:
            if live:
                with self._lock:
                    job.frozen = job.abandoned = True
                    job.inflight -= 1
                    self._lock.notify_all()
            raise
        job.entries[k] = entry
        if live:
            with self._lock:
                job.inflight -= 1
                self._lock.notify_all()

    def _freeze(self, jobs: list[_Job]) -> None:
        """The optimizer step is about to run: capture the live leaves of streamed
        `jobs` that the capture thread has not claimed yet (see :meth:`_stream`).

        By default this thread writes them straight from the live tensors,
        claiming leaf after leaf as the capture thread does, so that the two
        threads share what is left; it returns once every live leaf is written.
        No byte is copied: the checkpoint costs the CPU of one hash and one write
        of its bytes however early the step comes, and the step waits for the
        writes left, on two threads.  With ``copy_on_commit`` it waits for the
        live leaf being written and copies the others into reused buffers; the
        capture thread writes the copies behind the step: the step waits for a
        memory copy (faster than a write, on a machine with more cores than
        writers), for the CPU of that copy.

        If a write or a copy fails (no space, no memory), every streamed job not
        yet captured is abandoned (its thread raises instead of writing leaves
        the step is about to change: no torn version is published) and the error
        is raised.
        """
        copied = 0
        try:
            for job in jobs:
                if not job.streamed:
                    continue
                with self._lock:
                    job.frozen = True
                    state = job.state
                    # The leaves claimed from here on are the copies' (the
                    # capture thread waits for them, see _stream).
                    rest = job.order[job.position :]
                if state is None:  # the job is finished (or failed)
                    job.captured.set()
                    continue
                _, leaves, live = state
                if self.copy_on_commit:
                    with self._lock:
                        while job.inflight:  # the live leaf being written
                            self._lock.wait()
                    for k in rest:
                        if live[k]:
                            buf = self._copies.take(leaves[k].dtype, leaves[k].shape)
                            np.copyto(buf, leaves[k], casting="no")
                            job.copies[k] = buf
                            leaves[k] = buf
                            copied += buf.nbytes
                else:
                    history = self.history()
                    while True:
                        with self._lock:
                            if job.abandoned:  # the capture thread failed: commit raises it
                                break
                            if job.position == len(job.order) or not live[job.order[job.position]]:
                                while job.inflight:  # the live leaf the capture thread writes
                                    self._lock.wait()
                                break
                            k = job.order[job.position]
                            job.position += 1
                            job.inflight += 1
                        self._write_leaf(history, job, k, leaves[k], live=True)
                job.captured.set()
        except BaseException:
            for job in jobs:
                if job.streamed and not job.captured.is_set():
                    with self._lock:
                        job.frozen = job.abandoned = True
                        self._lock.notify_all()
                    job.copies = {}
                    job.captured.set()
            raise
        # Free buffers kept for the next commit: at most one commit's copies.
        self._copies.max_free_bytes = max(self._copies.max_free_bytes, copied)

    def _publish_now(self, seq, info, jobs) -> None:
        """Wait until `jobs` are on disk; then write ``latest`` (unless a newer
        tag already did, or a job failed: its error is raised by the engine's
        next call)."""
        for job in jobs:
            job.done.wait()
        if any(job.error is not None for job in jobs):
            return
        if self._history is not None:
            self._history.wait()
        if info is not None and getattr(info, "save_latest", False) and _is_rank0():
            with self._lock:
                if seq < self._latest_done:
                    return
                self._latest_done = seq
            SF.write_atomic(
                os.path.join(info.save_dir, "latest"), str(info.tag).encode(), durable=False
            )

    def _publish_loop(self) -> None:
        while True:
            with self._lock:
                while not self._publish:
                    self._lock.wait()
                item = self._publish[0]
            if item is None:
                return
            try:
                self._publish_now(*item)
            except BaseException as err:  # raised by the next call of the engine
                with self._lock:
                    self._error = err
            finally:
                with self._lock:
                    self._publish.popleft()
                    self._published.notify_all()

    def _raise_error(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise VlccRuntimeError(
                f"VlccCheckpointEngine: a checkpoint capture failed: {err!r}; "
                "that checkpoint was not stored"
            ) from err


#: Engines whose threads run; closed at interpreter exit (see :func:`_close_at_exit`).
_LIVE: weakref.WeakSet[VlccCheckpointEngine] = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


def _close_at_exit(engine: VlccCheckpointEngine) -> None:
    """Close `engine` at interpreter exit unless it is closed before.

    Its capture and publish threads are daemons (a training script that never
    closes the engine still exits), and a daemon thread still alive when the
    interpreter finalizes is ended by ``pthread_exit`` the next time it takes
    the GIL: unwinding it through torch's C++ frames calls ``std::terminate``,
    and the process ends in SIGABRT ("terminate called without an active
    exception") after the training succeeded.  So the engine finishes its
    writes and joins its threads in an ``atexit`` hook, registered when the
    first thread starts: after the lineage module's own hook (which closes
    the Histories nobody closed), hence run before it (``atexit`` runs
    last-in, first-out)."""
    _LIVE.add(engine)
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(_close_live_engines)


def _close_live_engines() -> None:
    for engine in list(_LIVE):
        try:
            engine.close()
        except Exception as err:  # reported; the exit goes on
            print(f"VlccCheckpointEngine: at exit: {err}", file=sys.stderr)


def _agree(error: BaseException | None, what: str) -> None:
    """Raise on every rank of the default process group when `error` is set on any.

    Every rank calls it at the same point (DeepSpeed's ``create`` and
    ``commit``, called on all ranks); one all-gather of a flag, on the CPU for
    gloo and MPI groups, on the current CUDA device otherwise.  Without a
    process group (or with one rank) `error` is raised as it is.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        if error is not None:
            raise error
        return
    backend = str(dist.get_backend())
    device = (
        torch.device("cpu")
        if "gloo" in backend or "mpi" in backend
        else torch.device("cuda", torch.cuda.current_device())
    )
    flags = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([int(error is not None)], dtype=torch.int32, device=device))
    failed = [r for r, f in enumerate(flags) if int(f.item())]
    if error is not None:
        raise VlccRuntimeError(
            f"VlccCheckpointEngine: {what} failed on rank {dist.get_rank()}: {error!r}; "
            "that checkpoint was not stored (every rank stops here); fix the cause "
            "(space, permissions, path) and save again"
        ) from error
    if failed:
        raise VlccRuntimeError(
            f"VlccCheckpointEngine: {what} failed on rank(s) {failed} (their logs say why); "
            "that checkpoint was not stored on any rank; fix the cause and save again"
        )


def _shutdown(lock, jobs, publish):
    with lock:
        jobs.append(None)  # wakes and ends the capture and publish threads (if any)
        publish.append(None)
        lock.notify_all()


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, collections.OrderedDict):
        out = collections.OrderedDict((k, _map_tensors(v, fn)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_tensors(v, fn) for v in obj)
    return obj


def _is_rank0() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
