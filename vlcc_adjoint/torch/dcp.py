"""A ``torch.distributed.checkpoint`` storage backend on a lineage :class:`~vlcc_adjoint.lineage.History`.

DCP's calls work unchanged; every save becomes one version of a branching
history (parents, branch, message, step and metadata), and any version
loads on any number of ranks (DCP reshards)::

    import torch.distributed.checkpoint as dcp
    from vlcc_adjoint.torch.dcp import VlccReader, VlccWriter

    dcp.save(state_dict, storage_writer=VlccWriter("run.vlcc", message="step 100"))
    fut = dcp.async_save(state_dict, storage_writer=writer)      # one reused staging area
    dcp.load(state_dict, storage_reader=VlccReader("run.vlcc", ref="main~3"))

How a save maps onto the history
--------------------------------

Every rank *stages* the tensor chunks DCP's planner gives it: it hashes
their 1 MiB chunks and writes the ones the repository lacks into its
content-addressed ``chunks/`` (unchanged chunks cost a hash; with
``deltas=True`` a changed chunk is stored as a compressed XOR against the
parent version's chunk at the same place).  Tensor chunks under 64 KiB
(biases, norms, step counters) are packed into leaves of up to 1 MiB per
rank (``__pack__.<rank>.<n>``), each item at a recorded byte offset: one
file for hundreds of them, since creating a file costs more than writing
64 KiB.  The items whose bytes are those of the writer's previous save are
packed apart from the others, so that a frozen base's norms and biases keep
the same packs (stored once) while only the packs of changed items (e.g.
adapters and their optimizer moments) are written.  Each rank's write results carry
the JSON leaf entries (chunk addresses), which DCP gathers on the
coordinator; the coordinator's ``finish`` then *commits once*: the version
(one leaf per tensor chunk, plus the metadata document, zlib-compressed
JSON, as leaf 0) is
published atomically under the graph lock.  If any rank fails, DCP never
calls ``finish`` and no version appears (the staged chunks are unreferenced
and ``gc`` removes them); a version is never half-written.

A version written by :class:`VlccWriter` is an ordinary version: ``vlcc
log``, ``History.diff``/``compare``, ``gc``, ``export`` and ``History.load``
(a dict ``{"dcp_metadata": uint8 array, "items": {name: array}}``, a name
per tensor chunk of its own or per pack) all work on it.

Durability: ``VlccWriter(path, durable=True)`` opens the history with
``durable=True``: every chunk file, directory entry and reference of a
save is fsynced before the version is published, as DCP's
``FileSystemWriter`` fsyncs its files with ``sync_files=True`` (its
default).  By default (``durable=False``) a save reaches the page cache
only: a committed version survives the process (``kill -9``), not a power
cut, as ``FileSystemWriter(sync_files=False)``.

Host memory: a synchronous save hashes and writes tensors where they lie
(a pack costs one reused buffer of at most 1 MiB); ``dcp.async_save`` adds
one staging area of exactly the rank's shard, reused by every save
(:mod:`vlcc_adjoint.torch._dcp_stage`).

Nothing is unpickled
--------------------

DCP's file system backend pickles its metadata and ``torch.save``s
non-tensor items.  Here both are JSON (:mod:`._dcp_meta`), stored as the
version's first leaf under the same chunk checksums as the tensors; tensors
are raw bytes (bfloat16 and float8 as integers of their width).  Non-tensor
items must be JSON-like values (numbers, strings, bytes, lists, tuples,
dicts); the writer refuses other objects, naming the key.  On load, DCP's
planner receives such a value as a ``torch.save`` stream this process
builds from the checked JSON (the planner reads it with
``weights_only=True``).

Checks on read
--------------

:class:`VlccReader` opens the history read-only, resolves the ref and reads
the metadata when it is constructed, so a bad path, an unknown ref or a
version not written by this backend raise there, with what to do.  Every
leaf read is checked against the metadata (dtype, shape) and verified chunk
by chunk (:class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the
file); each allocation is bounded by the declared sizes and the memory the
process may use.  Inside ``dcp.load`` a read error reaches the caller
wrapped in DCP's ``CheckpointException`` (its ``failures`` hold ours).

Each rank opens the history itself, so the path must be shared by every
rank (a parallel or network file system, or one machine's disk).  Each rank
resolves the reader's ref itself: to load one fixed version while others
commit, name it by id or tag.
"""

from ._dcp_read import VlccReader as VlccReader
from ._dcp_write import VlccWriter as VlccWriter

__all__ = ["VlccReader", "VlccWriter"]
