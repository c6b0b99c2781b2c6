"""Versions of distributed states: ``History(path, comm=comm)``.

A domain-decomposed simulation holds its fields as
:class:`~vlcc_adjoint.mpi.DistributedArray` leaves (one block per rank) next
to values every rank holds alike (the time, the step, parameters).  With a
communicator, :class:`~vlcc_adjoint.lineage.History` commits such a state as
**one** version, collectively, and loads any version on any number of ranks.
Nothing here is a second writer: the ranks use the two halves of the serial
repository's distributed save (:mod:`._parts`), and every version is an
ordinary version that ``log``, ``diff``, ``gc``, ``export`` and a serial
``History(path)`` read as they read any other.

How a version names every rank's blocks
---------------------------------------

A distributed leaf of global shape ``N`` over ``P`` ranks becomes ``P``
leaves of the version (rank ``r``'s block of shape
``decomposition.local_shape(r)``), consecutive, grouped in the version's
state spec by one node of the registered type :class:`Blocks`
(``"vlcc_adjoint.lineage:Blocks"``) whose ``aux`` is the decomposition as
JSON.  So the manifest that the serial reader checks, seals and verifies
holds the decomposition and every block's chunk addresses, and:

* a serial ``History(path).load(ref)`` rebuilds each :class:`Blocks` node
  as the global numpy array (:func:`assemble`);
* ``load(ref, decomposition=d)`` on ``Q`` ranks reads, for rank ``q``, only
  the rows of the stored blocks that overlap its block in ``d``
  (:meth:`~vlcc_adjoint.mpi.Decomposition.ranks_overlapping` finds them, and
  :meth:`Reader.read_rows <._read.Reader.read_rows>` reads only the chunks
  that hold those rows), and returns a :class:`DistributedArray` of ``d``;
* deduplication is per block (a block that did not change since the last
  version costs no byte), and so are deltas (``deltas=True``): each block is
  staged against the block of the same rank in the branch's tip;
* ``diff`` compares two versions block by block (the paths name the block:
  ``state['u'][2]`` is rank 2's block of ``u``).

The collective commit
---------------------

Every rank calls ``commit(state, message=, branch=)`` with its own blocks
and the same replicated values.  The steps, each closed by an agreement
(:meth:`~vlcc_adjoint.mpi.Guard.agree`: a reduction of status flags, so a
failure on one rank becomes the same :class:`~vlcc_adjoint.mpi.AgreedError`
on every rank, and a missing rank a
:class:`~vlcc_adjoint.mpi.CollectiveTimeoutError`):

1. Each rank flattens its state and checks its blocks (one block per
   distributed leaf, decomposed over the communicator, this rank's).  Rank 0
   resolves the branch's tip (the delta base) and sends it to all; every
   rank checks that its state has rank 0's structure (an xxh3-128 digest of
   the spec with the blocks' places taken out).
2. Each rank stages its blocks (rank 0 also the replicated leaves):
   chunks written to ``chunks/``, content-addressed; nothing visible.
3. The ranks' leaf entries (small JSON) are gathered on rank 0, which
   publishes the version (``commit_staged``: one version group, the graph
   replaced under its lock); the outcome is agreed, and the id broadcast.

So a version becomes visible in one atomic step (the graph's
``os.replace``) after every rank's chunks are written (durable first with
``durable=True``); a failure anywhere leaves only unreferenced chunks,
which ``gc`` sweeps.  Replicated values are taken from rank 0.

With ``local=`` (``History(path, comm=comm, local=dir)``) step 2 becomes a
copy into node-local storage, and the chunks reach the repository later, as
one pack per node, written by a background flush (:mod:`._local`).

Refs (``branch``, ``tag``, their deletion) and ``gc`` are collective too:
rank 0 changes the graph, the outcome is agreed, every rank returns the
same answer.  Reads (``log``, ``diff``, ``compare``...) are local.

References: Moody et al. (2010), "Design, modeling, and evaluation of a
scalable multi-level checkpointing system" (SCR), SC'10; Nicolae et al.
(2019), "VeloC: towards high performance adaptive asynchronous
checkpointing at large scale", IPDPS'19.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccValueError
from ..mpi import (
    Decomposition,
    DistributedArray,
    Guard,
    box_intersection,
    reader_decomposition,
)
from ..state import CONTAINERS, flatten, register, spec_nodes, unflatten
from ._commit import CommitPipeline
from ._format import Manifest
from ._parts import commit_staged, stage
from ._read import Reader

__all__ = [
    "BLOCKS_TYPE",
    "CommitPlan",
    "DISTRIBUTED_TYPE",
    "Blocks",
    "RankGroup",
    "blocks_of",
    "assemble",
]

#: The name the state specs of distributed versions give :class:`Blocks` nodes.
BLOCKS_TYPE = "vlcc_adjoint.lineage:Blocks"

#: The name state specs give a :class:`~vlcc_adjoint.mpi.DistributedArray` (a rank's block).
DISTRIBUTED_TYPE = CONTAINERS.by_type[DistributedArray].name


# -- every rank's block of one global array ----------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Blocks:
    """Every rank's block of one global array, as a distributed version stores it.

    **Arguments:**

    - `decomposition`: the :class:`~vlcc_adjoint.mpi.Decomposition` the
      blocks were committed in.
    - `blocks`: rank ``r``'s block at position ``r`` (shape
      ``decomposition.local_shape(r)``).

    Flattens to the blocks (one leaf each) with the decomposition as JSON;
    a version's spec names it ``"vlcc_adjoint.lineage:Blocks"``.  Rebuilt
    (a serial load) it is the global numpy array (:func:`assemble`), not a
    ``Blocks``: a reader without the ranks wants the field.
    """

    decomposition: Decomposition
    blocks: tuple[np.ndarray, ...]


def assemble(decomposition: Decomposition, blocks: Sequence[np.ndarray]) -> np.ndarray:
    """The global array of `blocks` (rank ``r``'s at position ``r``) in `decomposition`.

    **Raises:** ``ValueError`` when the blocks do not tile the decomposition
    (a count, a shape or a dtype that disagrees); a version's load reports it
    as damage of the version's manifest.
    """
    if len(blocks) != decomposition.nranks:
        raise VlccValueError(
            f"{len(blocks)} blocks for a decomposition over {decomposition.nranks} ranks"
        )
    dtypes = {b.dtype for b in blocks}
    if len(dtypes) > 1:
        raise VlccValueError(f"blocks of several dtypes {sorted(map(str, dtypes))}")
    for r, b in enumerate(blocks):
        if b.shape != decomposition.local_shape(r):
            raise VlccValueError(
                f"block {r} has shape {b.shape}, the decomposition gives it "
                f"{decomposition.local_shape(r)}"
            )
    dtype = blocks[0].dtype if blocks else np.dtype(np.float64)
    out = np.empty(decomposition.global_shape, dtype)
    for r, b in enumerate(blocks):
        out[decomposition.slices(r)] = b
    return out


def _flatten_blocks(obj: Blocks) -> tuple[list[np.ndarray], dict]:
    return list(obj.blocks), {"decomposition": obj.decomposition.to_json()}


def _unflatten_blocks(aux: Any, children: list) -> np.ndarray:
    if not isinstance(aux, dict):
        raise VlccValueError(f"malformed Blocks node in a state spec: {aux!r}")
    return assemble(Decomposition.from_json(aux.get("decomposition")), children)


register(Blocks, _flatten_blocks, _unflatten_blocks, name=BLOCKS_TYPE)


def blocks_of(spec: dict) -> dict[str, tuple[Decomposition, list[int]]]:
    """``{path: (decomposition, leaf indices)}`` of the :class:`Blocks` nodes of a
    state spec (a distributed version's), by the path of the array in the
    state; ``{}`` for any other spec.  Malformed nodes are left out (a load
    reports them)."""
    out = {}
    for kind, path, node in spec_nodes(spec.get("tree")):
        if kind != "type" or node.get("type") != BLOCKS_TYPE:
            continue
        try:
            d = Decomposition.from_json(node["aux"]["decomposition"])
            leaves = [item["leaf"] for item in node["items"]]
        except (KeyError, TypeError, ValueError):
            continue
        if len(leaves) == d.nranks and all(type(i) is int for i in leaves):
            out[path] = (d, leaves)
    return out


# -- rewriting a spec between its committed and its per-rank form --------------------------


def regroup(
    spec: dict,
    type_name: str,
    convert: Callable[[dict, list[int], list[dict]], tuple[dict, list[dict]]],
) -> dict:
    """A copy of state spec `spec` in which every node of the registered type
    `type_name` is rewritten, its leaves replaced, and every leaf renumbered.

    **Arguments:**

    - `spec`: a state spec (``flatten``'s, or a manifest's, validated).
    - `type_name`: the registered name of the nodes to rewrite; each holds
      only leaves, consecutive (``{"leaf": i}``, ``{"leaf": i + 1}``...).
    - `convert(node, old, entries) -> (new_node, new_entries)`: the new node
      (``type`` and ``aux``; its ``items`` are filled in here) and its
      leaves' ``{"dtype", "shape"}`` entries, from the node, its old leaf
      indices and their entries.  Called in the order of the old leaves.

    **Returns:** the new spec.  Its leaves keep their order, a rewritten
    node's new leaves taking the place of its old ones.  Raises
    ``ValueError`` for a node whose items are not consecutive leaves.
    """
    out = copy.deepcopy(spec)
    nodes: dict[int, tuple[dict, list[int]]] = {}
    for kind, _, node in spec_nodes(out["tree"]):
        if kind == "type" and node.get("type") == type_name:
            items = node.get("items")
            if not (
                isinstance(items, list)
                and items
                and all(isinstance(x, dict) and type(x.get("leaf")) is int for x in items)
            ):
                raise VlccValueError(f"a {type_name} node whose items are not leaves")
            old = [x["leaf"] for x in items]
            if old != list(range(old[0], old[0] + len(old))):
                raise VlccValueError(f"a {type_name} node whose leaves are not consecutive")
            nodes[old[0]] = (node, old)
    mapping: dict[int, int] = {}
    entries: list[dict] = []
    fresh: set[int] = set()
    grouped = {i for _, old in nodes.values() for i in old}
    for i, entry in enumerate(out["leaves"]):
        if i in nodes:
            node, old = nodes[i]
            new_node, new_entries = convert(node, old, [out["leaves"][k] for k in old])
            first = len(entries)
            items = [{"leaf": first + j} for j in range(len(new_entries))]
            fresh.update(id(x) for x in items)
            node.clear()
            node.update(new_node)
            node["items"] = items
            entries.extend(new_entries)
        elif i not in grouped:
            mapping[i] = len(entries)
            entries.append(entry)
    for kind, _, node in spec_nodes(out["tree"]):
        if kind == "leaf" and id(node) not in fresh:
            node["leaf"] = mapping[node["leaf"]]
    out["leaves"] = entries
    return out


def _structure_digest(spec: dict) -> np.ndarray:
    """Two uint64 words: xxh3-128 of `spec` with each distributed node's rank
    and block shape taken out (what every rank of one commit must share)."""
    plain = copy.deepcopy(spec)
    for kind, _, node in spec_nodes(plain["tree"]):
        if kind == "type" and node.get("type") == DISTRIBUTED_TYPE:
            leaf = node["items"][0]["leaf"]
            node["aux"] = {"decomposition": node["aux"]["decomposition"]}
            plain["leaves"][leaf] = {"dtype": plain["leaves"][leaf]["dtype"]}
    digest = xxhash.xxh3_128_digest(json.dumps(plain, sort_keys=True).encode())
    return np.frombuffer(digest, np.uint64).copy()


# -- the ranks' part of a History ---------------------------------------------------------


@dataclasses.dataclass
class CommitPlan:
    """One rank's part of a distributed commit, checked (:meth:`RankGroup.prepare`).

    **Attributes:** `leaves` and `spec` (the rank's flattened state); `dist`
    (``{leaf: decomposition}`` of its blocks); `mine` (the leaves this rank
    writes: its blocks, and on rank 0 the replicated values too); `index`
    (each leaf's first leaf index in the version); `base` (the branch's tip
    shared by rank 0: the delta base, ``""`` when none); `announced` (what
    rank 0 shared instead, see :meth:`RankGroup.prepare`).
    """

    leaves: list[np.ndarray]
    spec: dict
    dist: dict[int, Decomposition]
    mine: list[int]
    index: list[int]
    base: str
    announced: str = ""


class RankGroup:
    """The collective half of a :class:`~vlcc_adjoint.lineage.History` opened with ``comm=``.

    **Arguments:**

    - `comm`: an mpi4py intra-communicator (every rank opens the History).
    - `timeout`: the most seconds a collective step waits for the other
      ranks (:class:`~vlcc_adjoint.mpi.Guard`).

    Creating one is collective (the guard duplicates the communicator).
    :meth:`attach` then gives it the History's commit pipeline.  See the
    module docstring for the protocol.
    """

    def __init__(self, comm: Any, timeout: float | None) -> None:
        self.guard = Guard(comm, timeout=timeout)
        self.rank = self.guard.rank
        self.size = self.guard.size
        self._pipeline: CommitPipeline | None = None

    def attach(self, pipeline: CommitPipeline) -> None:
        """Work on `pipeline` (the History's: its repository, chunk store, reader, refs)."""
        self._pipeline = pipeline

    @property
    def pipeline(self) -> CommitPipeline:
        if self._pipeline is None:
            raise VlccValueError("this rank group has no History attached")
        return self._pipeline

    @property
    def reader(self) -> Reader:
        return self.pipeline.reader

    def in_turn(self, what: str, fn: Callable[[], None], undo: Callable[[], None]) -> None:
        """`fn` on rank 0, then on the others (opening, and so creating, a
        repository); a failure anywhere raises the same
        :class:`~vlcc_adjoint.mpi.AgreedError` on every rank, after `undo` on
        the ranks where `fn` succeeded.  Collective."""
        error: BaseException | None = None
        if self.rank == 0:
            try:
                fn()
            except Exception as err:
                error = err
        self.guard.agree(error, what)
        if self.rank != 0:
            try:
                fn()
            except Exception as err:
                error = err
        try:
            self.guard.agree(error, what)
        except BaseException:
            if error is None:
                undo()
            raise

    # -- sharing bytes ---------------------------------------------------------------

    def share(self, data: bytes | None, what: str) -> bytes:
        """Rank 0's `data` on every rank (any length)."""
        mine = np.array([len(data) if self.rank == 0 and data is not None else 0], np.int64)
        n = int(self.guard.allreduce(mine, "max", what)[0])
        buf = np.zeros(n, np.uint8)
        if self.rank == 0 and data:
            buf[:] = np.frombuffer(data, np.uint8)
        if n:
            self.guard.wait([self.guard.comm.Ibcast(buf, root=0)], what)
        return buf.tobytes()

    def on_root(self, what: str, fn: Callable[[], Any], encode=str, decode=str) -> Any:
        """Run `fn` on rank 0 (a change of the graph); the same result, or the
        same :class:`~vlcc_adjoint.mpi.AgreedError`, on every rank.  Collective.

        `encode` turns the result into text, `decode` the text into what every
        rank returns."""
        error: BaseException | None = None
        text = ""
        if self.rank == 0:
            try:
                text = encode(fn())
            except Exception as err:
                error = err
        self.guard.agree(error, what)
        self.pipeline.repo.refresh()
        return decode(self.share(text.encode(), what).decode())

    # -- commit -----------------------------------------------------------------------

    def commit(self, state: Any, message: str, meta: dict | None, branch: str | None) -> str:
        """``History.commit`` with ``comm=`` (collective; see the module docstring)."""
        guard, pipeline = self.guard, self.pipeline
        plan = self.prepare(state, branch)
        error: BaseException | None = None
        entries: list[dict] = []
        try:
            entries = stage(
                pipeline,
                [plan.leaves[i] for i in plan.mine],
                plan.base or None,
                [plan.index[i] + (self.rank if i in plan.dist else 0) for i in plan.mine],
            )
        except Exception as err:
            error = err
        guard.agree(error, "writing the blocks of a distributed commit")
        parts = guard.gatherv(
            np.frombuffer(json.dumps(entries).encode(), np.uint8),
            0,
            "gathering the blocks of a distributed commit",
        )
        vid = ""
        if self.rank == 0:
            assert parts is not None
            try:
                by_rank = [json.loads(p.tobytes()) for p in parts]
                vid = self.publish(plan, by_rank, message, meta, branch)
            except Exception as err:
                error = err
        guard.agree(error, "publishing a distributed version")
        vid = self.share(vid.encode(), "sharing the new version's id").decode()
        self.switched(branch)
        return vid

    def switched(self, branch: str | None) -> None:
        """After rank 0 published a version onto `branch`: the other ranks switch
        to it too, and every rank re-reads the graph."""
        repo, pipeline = self.pipeline.repo, self.pipeline
        if self.rank != 0:
            with repo.lock:
                if branch is not None:
                    pipeline.refs.switch(branch)
        repo.refresh()

    def prepare(
        self, state: Any, branch: str | None, announce: Callable[[], str] | None = None
    ) -> CommitPlan:
        """Step 1 of a distributed commit (collective): this rank's leaves checked,
        rank 0's delta base shared, every rank's structure compared with rank
        0's; the same :class:`~vlcc_adjoint.mpi.AgreedError` everywhere on failure.

        With `announce`, rank 0 shares ``announce()`` instead of the delta base
        (the plan's `announced`; its `base` is then ``""``): the node-local
        tier's version id, in the same message."""
        guard = self.guard
        error: BaseException | None = None
        plan: tuple[list[np.ndarray], dict, dict[int, Decomposition]] | None = None
        digest = np.zeros(2, np.uint64)
        base = ""
        try:
            plan = self._plan(state)
            digest = _structure_digest(plan[1])
            if self.rank == 0:
                base = announce() if announce is not None else self._base(branch) or ""
        except Exception as err:
            error = err
        guard.agree(error, "checking the state of a distributed commit")
        base = self.share(base.encode(), "sharing the delta base").decode()
        announced = ""
        if announce is not None:
            announced, base = base, ""
        digests = guard.allgather(digest, "comparing the ranks' states")
        if not np.array_equal(digests[self.rank], digests[0]):
            error = VlccValueError(
                f"rank {self.rank}'s state has another structure than rank 0's (other keys, "
                "types, dtypes, replicated shapes or decompositions); every rank commits the "
                "same state with its own blocks"
            )
        guard.agree(error, "comparing the ranks' states")
        assert plan is not None
        leaves, spec, dist = plan
        sizes = {i: d.nranks for i, d in dist.items()}
        return CommitPlan(
            leaves,
            spec,
            dist,
            [i for i in range(len(leaves)) if i in dist or self.rank == 0],
            _new_indices(len(leaves), sizes),
            base,
            announced,
        )

    def _plan(self, state: Any) -> tuple[list[np.ndarray], dict, dict[int, Decomposition]]:
        """This rank's leaves, spec and ``{leaf: decomposition}`` of its blocks, checked."""
        leaves, spec = flatten(state)
        dist: dict[int, Decomposition] = {}
        for kind, path, node in spec_nodes(spec["tree"]):
            if kind != "type" or node.get("type") != DISTRIBUTED_TYPE:
                continue
            d = Decomposition.from_json(node["aux"]["decomposition"])
            if d.nranks != self.size or node["aux"]["rank"] != self.rank:
                raise VlccValueError(
                    f"{path} is rank {node['aux']['rank']}'s block of a decomposition over "
                    f"{d.nranks} ranks, but rank {self.rank} of {self.size} commits it; "
                    "decompose over the History's communicator, each rank its own block"
                )
            dist[node["items"][0]["leaf"]] = d
        return leaves, spec, dist

    def _base(self, branch: str | None) -> str | None:
        """The tip of the branch the version goes onto (rank 0; the delta base)."""
        pipeline = self.pipeline
        g = pipeline.repo.refresh()
        with pipeline.repo.lock:
            target = pipeline.refs.target_branch(
                branch, " (a version or tag was checked out); commit onto a branch: branch='name'"
            )
            return g.branches.get(target) or pipeline.refs.head_id(g)

    def publish(
        self,
        plan: CommitPlan,
        by_rank: list[list[dict]],
        message: str,
        meta: dict | None,
        branch: str | None,
        packs: Sequence[str] | None = None,
        vid: str | None = None,
    ) -> str:
        """Rank 0: every rank's leaf entries (`by_rank`, rank ``r``'s staged
        leaves of `plan` in order) in the version's leaf order, published
        (:func:`._parts.commit_staged`; `packs` and `vid` as there)."""
        spec, dist, mine = plan.spec, plan.dist, plan.mine
        if any(len(e) != (len(mine) if r == 0 else len(dist)) for r, e in enumerate(by_rank)):
            raise VlccValueError("a rank staged another number of blocks than its state holds")
        staged = [dict(zip(mine if r == 0 else sorted(dist), e)) for r, e in enumerate(by_rank)]
        ordered: list[dict] = []
        for i in range(len(spec["leaves"])):
            if i in dist:
                ordered.extend(staged[r][i] for r in range(self.size))
            else:
                ordered.append(staged[0][i])

        def to_blocks(node: dict, old: list[int], entries: list[dict]) -> tuple[dict, list[dict]]:
            d = Decomposition.from_json(node["aux"]["decomposition"])
            dtype = entries[0]["dtype"]
            return (
                {"type": BLOCKS_TYPE, "aux": {"decomposition": d.to_json()}},
                [{"dtype": dtype, "shape": list(d.local_shape(r))} for r in range(d.nranks)],
            )

        version_spec = regroup(spec, DISTRIBUTED_TYPE, to_blocks)
        return commit_staged(
            self.pipeline,
            self.pipeline.drain,
            version_spec,
            ordered,
            message,
            meta,
            branch,
            None,
            packs,
            vid,
        )

    # -- load ------------------------------------------------------------------------

    def load(self, vid: str, decomposition: Decomposition | Callable | None) -> Any:
        """This rank's part of version `vid`: every :class:`Blocks` leaf as a
        :class:`~vlcc_adjoint.mpi.DistributedArray` of the reader's decomposition
        (see :func:`vlcc_adjoint.mpi.reader_decomposition`), replicated values whole.  Local: each
        rank reads only the rows of the stored blocks that overlap its own."""
        reader = self.reader
        m = reader.manifest(vid)
        manifest_file = reader.repo.p("versions", vid, "zarr.json")
        # The reader's decomposition of each stored one (a user's error in
        # `decomposition` is raised as it is, before the manifest is rewritten).
        targets: dict[str, tuple[Decomposition, Decomposition]] = {}
        for kind, path, node in spec_nodes(m.spec.get("tree")):
            if kind != "type" or node.get("type") != BLOCKS_TYPE:
                continue
            aux = node.get("aux")
            try:
                stored = Decomposition.from_json(aux.get("decomposition"))
            except (AttributeError, TypeError, ValueError) as err:
                raise reader.corrupt(
                    m, f"the Blocks node of {path} holds no decomposition ({err})", manifest_file
                ) from None
            key = json.dumps(stored.to_json())
            if key not in targets:
                targets[key] = (
                    stored,
                    reader_decomposition(decomposition, stored.global_shape, self.size, stored),
                )
        by_old: dict[int, tuple[list[int], Decomposition, Decomposition]] = {}

        def to_local(node: dict, old: list[int], entries: list[dict]) -> tuple[dict, list[dict]]:
            key = json.dumps(Decomposition.from_json(node["aux"]["decomposition"]).to_json())
            stored, target = targets[key]
            by_old[old[0]] = (old, stored, target)
            aux = {"decomposition": target.to_json(), "rank": self.rank}
            shape = list(target.local_shape(self.rank))
            return {"type": DISTRIBUTED_TYPE, "aux": aux}, [
                {"dtype": entries[0]["dtype"], "shape": shape}
            ]

        try:
            local_spec = regroup(m.spec, BLOCKS_TYPE, to_local)
        except (KeyError, TypeError, IndexError, ValueError) as err:
            raise reader.corrupt(
                m, f"its Blocks nodes are malformed ({err!r})", manifest_file
            ) from None
        # The leaves in the local spec's order: regroup numbers them in the
        # version's order, a group taking the place of its first leaf.
        taken = {i for old, _, _ in by_old.values() for i in old}
        leaves: list[np.ndarray] = []
        for i in range(len(m.leaves)):
            if i in by_old:
                old, stored, target = by_old[i]
                leaves.append(self._block(m, old, stored, target, manifest_file))
            elif i not in taken:
                leaves.append(reader.read_rows(m, i, None))
        return unflatten(local_spec, leaves)

    def _block(
        self,
        m: Manifest,
        old: list[int],
        stored: Decomposition,
        target: Decomposition,
        manifest_file: str,
    ) -> np.ndarray:
        """This rank's block in `target` of the global array stored as the
        version's leaves `old` (rank ``r``'s block in `stored` at ``old[r]``)."""
        reader = self.reader
        if len(old) != stored.nranks:
            raise reader.corrupt(
                m, f"a Blocks node lists {len(old)} blocks of {stored.nranks} ranks", manifest_file
            )
        dtypes = set()
        for r, i in enumerate(old):
            layout = m.leaves[i][0]
            dtypes.add(layout.dtype)
            if layout.shape != stored.local_shape(r):
                raise reader.corrupt(
                    m,
                    f"block {r} (leaf {i}) has shape {layout.shape}, its decomposition "
                    f"gives {stored.local_shape(r)}",
                    manifest_file,
                )
        if len(dtypes) != 1:
            raise reader.corrupt(m, "the blocks of one array have several dtypes", manifest_file)
        dtype = dtypes.pop()
        shape = target.local_shape(self.rank)
        reader.check_alloc(m, int(np.prod(shape, dtype=object)) * dtype.itemsize, "a block")
        out = np.empty(shape, dtype)
        mine = target.block(self.rank)
        origin = target.offsets(self.rank)
        for s in stored.ranks_overlapping(mine):
            theirs = stored.block(s)
            box = box_intersection(mine, theirs)
            if box is None:
                continue
            at = stored.offsets(s)
            if not box:  # a 0-d array: one block
                out[()] = reader.read_rows(m, old[s], None)[()]
                continue
            rows = reader.read_rows(m, old[s], (box[0][0] - at[0], box[0][1] - at[0]))
            part = rows[
                (slice(None),)
                + tuple(slice(lo - a, hi - a) for (lo, hi), a in zip(box[1:], at[1:]))
            ]
            out[tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(box, origin))] = part
        return out

    def close(self) -> None:
        """Free the guard's communicator (collective, as the History's close is)."""
        self.guard.close()


def _new_indices(n: int, sizes: dict[int, int]) -> list[int]:
    """The version's first leaf index of each of a state's `n` leaves, where
    leaf ``i`` in `sizes` becomes ``sizes[i]`` leaves (one per rank)."""
    out, k = [], 0
    for i in range(n):
        out.append(k)
        k += sizes.get(i, 1)
    return out
