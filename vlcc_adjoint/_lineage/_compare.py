"""Differences between versions: per-leaf statistics and tolerance checks.

Leaves are matched by their *path* in the state (``state['u']``,
``state.params.c``, ``state[2]``), the way ``flatten`` names them in its
error messages, so two versions whose structures differ still compare
leaf by leaf.  The non-array parts of a state (step counters, times,
strings) are compared as values.

Numbers, for two arrays ``a`` (the first version) and ``b`` of one dtype
and shape, over their finite and non-finite values alike:

* ``max_abs = max |a - b|``, where two NaNs, or two equal infinities,
  count as equal (difference 0) and a NaN against a number, or an infinity
  against anything else, counts as an infinite difference;
* ``max_rel = max |a - b| / max(|a|, |b|)`` elementwise (0 where both are
  0; at most 2 for finite values: 1 where one side is 0, 2 for a sign
  flip), a measure that needs only the elements that differ, so it is
  computed from the differing chunks alone;
* ``close`` (``compare``): ``|a - b| <= atol + rtol * |b|`` elementwise,
  NaN equal to NaN (``numpy.allclose(equal_nan=True)``).  With ``rtol = atol
  = 0`` this is numerical equality (``-0.0 == 0.0``); `bitwise` tells whether
  the bytes are identical too.

Chunks with equal addresses are equal without being read, so comparing two
versions of a large state that share most chunks reads only the chunks that
differ.

Versions committed by several ranks (:mod:`._ranks`) hold a distributed
array as every rank's block, one leaf each (``state['u'][2]``: rank 2's
block).  Two such versions in the same decomposition compare block by
block (chunks again); in different decompositions (another rank count, or
another block layout) the blocks do not match, and the array is compared
whole, as one leaf at its own path (``state['u']``), each side assembled
from its blocks.  Integers and booleans are compared as float64; other dtypes
(strings, structured, datetime) only for equality of their bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any, Protocol

import numpy as np

from ..errors import VlccKeyError
from ..state import byte_view, dtype_from_json, flatten, inline_value, spec_nodes
from ._format import Layout, Manifest
from ._graph import Version
from ._ranks import assemble, blocks_of


class VersionSource(Protocol):
    """What a diff reads versions through (:class:`._read.Reader`)."""

    def reading(self) -> AbstractContextManager[object]:
        """Hold the repository's versions against removal (gc) while reading."""
        ...

    def read_chunk(
        self,
        m: Manifest,
        where: str,
        j: int,
        addr: str,
        layout: Layout,
        cfg: dict | None,
        out: memoryview | None,
    ) -> Any:
        """Chunk `j` of a leaf of version `m`, verified."""
        ...

    def read_leaf(self, m: Manifest, i: int, path: str) -> np.ndarray:
        """Leaf `i` of version `m`, verified."""
        ...


#: ``open(ref) -> (version id, manifest, source)``: how a diff finds a version.
OpenVersion = Callable[[Any], tuple[str, Manifest, VersionSource]]


def walk_spec(tree, path: str = "state") -> Iterator[tuple[str, str, object]]:
    """Yield ``("leaf", path, index)`` and ``("value", path, node)`` for a spec
    tree: the state model's walk (:func:`vlcc_adjoint.state.spec_nodes`),
    with a registered type's name reported as the value ``path.__type__``
    (so a diff shows a type that changed)."""
    for kind, where, node in spec_nodes(tree, path):
        if kind == "leaf":
            yield "leaf", where, node["leaf"]
        elif kind == "type":
            yield "value", where + ".__type__", {"value": node["type"]}
        else:
            yield "value", where, node


def value_of(node):
    """The Python value of an inline spec node (for display)."""
    try:
        return inline_value(node)
    except Exception:
        return node


@dataclasses.dataclass(frozen=True)
class LeafDiff:
    """How one leaf differs between two versions.

    **Attributes:**

    - `path`: where the leaf sits in the state, e.g. ``state['u']``.
    - `status`: ``"same"``, ``"changed"`` (same dtype and shape, other
      values), ``"reshaped"`` (dtype or shape differ), ``"added"`` (only in
      the second version) or ``"removed"`` (only in the first).
    - `dtype`, `shape`: of the first version's leaf (the second's when added);
      `other_dtype`, `other_shape`: of the second's.
    - `max_abs`, `max_rel`: see the module docstring (``None`` where not
      numeric or not comparable; 0.0 for unchanged numeric leaves).
    - `n_changed`: number of elements whose bytes differ (``None`` if not
      comparable).
    - `close`: within ``compare``'s tolerances (``diff`` uses 0, 0).
    - `bitwise`: the bytes are identical.
    """

    path: str
    status: str
    dtype: str
    shape: tuple[int, ...]
    other_dtype: str
    other_shape: tuple[int, ...]
    max_abs: float | None = None
    max_rel: float | None = None
    n_changed: int | None = None
    close: bool = True
    bitwise: bool = True

    @property
    def changed(self) -> bool:
        """Whether the leaf differs at all (values, dtype, shape or presence)."""
        return self.status != "same"


@dataclasses.dataclass(frozen=True)
class Diff:
    """The differences between versions `a` and `b` (``History.diff``).

    **Attributes:** `a`, `b` (what was compared: version ids, or ``"<state>"``),
    `leaves` (a :class:`LeafDiff` per leaf path, in the first version's
    order, then leaves only in the second), `values` (``(path, value in a,
    value in b)`` for every non-array part of the state that differs).
    """

    a: str
    b: str
    leaves: tuple[LeafDiff, ...]
    values: tuple[tuple[str, object, object], ...]

    @property
    def changed(self) -> bool:
        """Whether anything differs."""
        return bool(self.values) or any(d.changed for d in self.leaves)

    @property
    def changed_leaves(self) -> tuple[LeafDiff, ...]:
        return tuple(d for d in self.leaves if d.changed)

    def __getitem__(self, path: str) -> LeafDiff:
        for d in self.leaves:
            if d.path == path:
                return d
        raise VlccKeyError(f"no leaf {path!r} in this diff; paths: {[d.path for d in self.leaves]}")

    def table(self) -> str:
        """A printable table, one line per leaf and per differing value."""
        rows = [("leaf", "status", "dtype", "shape", "max |a-b|", "max rel", "n changed")]
        for d in self.leaves:
            shape = (
                str(list(d.shape))
                if d.shape == d.other_shape
                else f"{list(d.shape)}->{list(d.other_shape)}"
            )
            dtype = d.dtype if d.dtype == d.other_dtype else f"{d.dtype}->{d.other_dtype}"
            rows.append(
                (
                    d.path,
                    d.status,
                    dtype,
                    shape,
                    _num(d.max_abs),
                    _num(d.max_rel),
                    "" if d.n_changed is None else str(d.n_changed),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"diff {self.a} {self.b}"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for path, va, vb in self.values:
            lines.append(f"  {path}: {va!r} -> {vb!r}")
        if not self.changed:
            lines.append("  (identical)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome of ``History.compare(a, b, rtol, atol)`` (truthy when equal).

    **Attributes:**

    - `equal`: every leaf is within tolerance and the structures and
      non-array values match.
    - `bitwise`: the two states are identical byte for byte.
    - `first`: the first leaf (state order) outside tolerance, or ``None``;
      `first_leaf` is its path.  `reason` says what differs, in words.
    - `max_abs`, `max_rel`: the largest differences over all leaves.
    - `rtol`, `atol`: the tolerances used; `diff`: the full :class:`Diff`.
    """

    equal: bool
    bitwise: bool
    first: LeafDiff | None
    reason: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    diff: Diff

    @property
    def first_leaf(self) -> str | None:
        return None if self.first is None else self.first.path

    def __bool__(self) -> bool:
        return self.equal

    def __repr__(self) -> str:
        return (
            f"Comparison(equal={self.equal}, bitwise={self.bitwise}, first_leaf="
            f"{self.first_leaf!r}, max_abs={self.max_abs:.3g}, max_rel={self.max_rel:.3g}, "
            f"reason={self.reason!r})"
        )


def _num(x) -> str:
    return "" if x is None else f"{x:.3g}"


class Accumulator:
    """Running statistics of one leaf over its differing chunks."""

    def __init__(self, dtype: np.dtype, rtol: float, atol: float):
        self.numeric = dtype.kind in "biufc" and dtype.names is None
        self.rtol, self.atol = rtol, atol
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.n_changed = 0
        self.close = True
        self.bitwise = True

    def add(self, a: np.ndarray, b: np.ndarray, same_bytes: bool) -> None:
        """Account for a chunk pair (flat arrays of the leaf's dtype)."""
        if same_bytes:
            return
        self.bitwise = False
        if a.size == 0:
            return
        ra, rb = a.view(np.uint8).reshape(a.size, -1), b.view(np.uint8).reshape(b.size, -1)
        self.n_changed += int(np.count_nonzero((ra != rb).any(axis=1)))
        if not self.numeric:
            self.close = False
            return
        if a.dtype.kind == "c":
            fa, fb = a.astype(np.complex128), b.astype(np.complex128)
        else:
            fa, fb = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(fa - fb)
            nan_a, nan_b = np.isnan(fa), np.isnan(fb)
            d[(fa == fb) | (nan_a & nan_b)] = 0.0
            d[np.isnan(d)] = np.inf
            if d.size:
                self.max_abs = max(self.max_abs, float(d.max()))
            scale = np.maximum(np.abs(fa), np.abs(fb))
            rel = np.zeros_like(d)
            nz = d > 0
            rel[nz] = d[nz] / scale[nz]  # inf where d is inf; d > 0 implies scale > 0 otherwise
            rel[np.isnan(rel)] = np.inf
            if rel.size:
                self.max_rel = max(self.max_rel, float(rel.max()))
            if self.close:
                tol = self.atol + (self.rtol * np.abs(fb) if self.rtol else 0.0)
                ok = (d == 0) | (d <= tol)
                self.close = bool(ok.all())

    def result(self) -> tuple[float | None, float | None]:
        if not self.numeric:
            return None, None
        return self.max_abs, self.max_rel


# -- diffing versions and states ------------------------------------------------------


def _operand(x: Any, open_version: OpenVersion) -> tuple[str, dict, tuple]:
    """(label, spec, per-leaf reader info) of a ref or a live state."""
    if isinstance(x, (str, Version)):
        vid, m, source = open_version(x)
        return vid, m.spec, ("version", source, m)
    leaves, spec = flatten(x)
    return "<state>", spec, ("state", leaves)


def diff_states(
    open_a: OpenVersion, open_b: OpenVersion, a: Any, b: Any, rtol: float, atol: float
) -> Diff:
    """``History.diff`` and ``History.compare``: see there and the module docstring.

    `a` and `b` are refs (found with `open_a`, `open_b`: the repositories of
    the two sides) or live states."""
    la, spec_a, src_a = _operand(a, open_a)
    lb, spec_b, src_b = _operand(b, open_b)
    items_a = list(walk_spec(spec_a["tree"]))
    items_b = list(walk_spec(spec_b["tree"]))
    leaves_a = {p: i for k, p, i in items_a if k == "leaf"}
    leaves_b = {p: i for k, p, i in items_b if k == "leaf"}
    # Distributed arrays stored in different decompositions, or as blocks on
    # one side and whole on the other, are compared whole.
    blocks_a, blocks_b = blocks_of(spec_a), blocks_of(spec_b)
    whole: dict[str, tuple[Any, Any]] = {}
    for p in blocks_a.keys() | blocks_b.keys():
        if p in blocks_a and p in blocks_b:
            if blocks_a[p][0] != blocks_b[p][0]:
                whole[p] = (blocks_a[p], blocks_b[p])
        elif p in blocks_a and p in leaves_b:
            whole[p] = (blocks_a[p], leaves_b[p])
        elif p in blocks_b and p in leaves_a:
            whole[p] = (leaves_a[p], blocks_b[p])
    for p, sides in whole.items():
        for leaves, side in zip((leaves_a, leaves_b), sides):
            if isinstance(side, int):
                leaves.pop(p)
            else:
                for r in range(len(side[1])):
                    leaves.pop(f"{p}[{r}]", None)
    values_a = {p: n for k, p, n in items_a if k == "value"}
    values_b = {p: n for k, p, n in items_b if k == "value"}
    order = list(leaves_a) + [p for p in leaves_b if p not in leaves_a]
    out = []
    with ExitStack() as held:
        for src in (src_a, src_b):
            if src[0] == "version":
                held.enter_context(src[1].reading())
        for path in sorted(whole):
            side_a, side_b = whole[path]
            arr_a = _assembled(src_a, side_a, path)
            arr_b = _assembled(src_b, side_b, path)
            out.append(_arrays_diff(path, arr_a, arr_b, rtol, atol))
        for path in order:
            out.append(
                _leaf_diff(
                    path,
                    leaves_a.get(path),
                    leaves_b.get(path),
                    spec_a,
                    spec_b,
                    src_a,
                    src_b,
                    rtol,
                    atol,
                )
            )
    values = []
    for path in list(values_a) + [p for p in values_b if p not in values_a]:
        na, nb = values_a.get(path), values_b.get(path)
        if na != nb:
            values.append(
                (
                    path,
                    "<absent>" if na is None else value_of(na),
                    "<absent>" if nb is None else value_of(nb),
                )
            )
    return Diff(la, lb, tuple(out), tuple(values))


def _leaf_meta(spec, i):
    entry = spec["leaves"][i]
    return dtype_from_json(entry["dtype"]), tuple(entry["shape"])


def _leaf_diff(path, ia, ib, spec_a, spec_b, src_a, src_b, rtol, atol) -> LeafDiff:
    if ia is None or ib is None:
        dt, sh = _leaf_meta(spec_b if ia is None else spec_a, ib if ia is None else ia)
        return LeafDiff(
            path,
            "added" if ia is None else "removed",
            dt.str,
            sh,
            dt.str,
            sh,
            close=False,
            bitwise=False,
        )
    dta, sha = _leaf_meta(spec_a, ia)
    dtb, shb = _leaf_meta(spec_b, ib)
    if dta != dtb or dta.str != dtb.str or sha != shb:
        return LeafDiff(path, "reshaped", dta.str, sha, dtb.str, shb, close=False, bitwise=False)
    acc = Accumulator(dta, rtol, atol)
    chunked = False
    if src_a[0] == "version" and src_b[0] == "version":
        ha, ma = src_a[1], src_a[2]
        hb, mb = src_b[1], src_b[2]
        lay_a, cfg_a, addr_a = ma.leaves[ia]
        lay_b, cfg_b, addr_b = mb.leaves[ib]
        if lay_a.chunk_shape == lay_b.chunk_shape:
            chunked = True
            for j, ((off, valid, _), xa, xb) in enumerate(zip(lay_a.spans(), addr_a, addr_b)):
                if xa == xb:
                    continue
                ca = ha.read_chunk(ma, f"leaf {path}", j, xa, lay_a, cfg_a, None)
                cb = hb.read_chunk(mb, f"leaf {path}", j, xb, lay_b, cfg_b, None)
                ca, cb = memoryview(ca)[:valid], memoryview(cb)[:valid]
                same = ca == cb
                acc.add(_as_items(ca, dta), _as_items(cb, dta), same)
    if not chunked:
        _add_whole(acc, _whole(src_a, ia, path), _whole(src_b, ib, path))
    max_abs, max_rel = acc.result()
    status = "same" if acc.bitwise else "changed"
    return LeafDiff(
        path,
        status,
        dta.str,
        sha,
        dtb.str,
        shb,
        max_abs,
        max_rel,
        acc.n_changed,
        acc.close,
        acc.bitwise,
    )


def _add_whole(acc: Accumulator, arr_a: np.ndarray, arr_b: np.ndarray) -> None:
    """Add two whole arrays of one dtype and shape to `acc`."""
    arr_a, arr_b = np.ascontiguousarray(arr_a), np.ascontiguousarray(arr_b)
    acc.add(arr_a.reshape(-1), arr_b.reshape(-1), byte_view(arr_a) == byte_view(arr_b))


def _arrays_diff(path, arr_a, arr_b, rtol, atol) -> LeafDiff:
    """The :class:`LeafDiff` of two whole arrays (a distributed array assembled)."""
    if arr_a.dtype != arr_b.dtype or arr_a.shape != arr_b.shape:
        return LeafDiff(
            path,
            "reshaped",
            arr_a.dtype.str,
            arr_a.shape,
            arr_b.dtype.str,
            arr_b.shape,
            close=False,
            bitwise=False,
        )
    acc = Accumulator(arr_a.dtype, rtol, atol)
    _add_whole(acc, arr_a, arr_b)
    max_abs, max_rel = acc.result()
    return LeafDiff(
        path,
        "same" if acc.bitwise else "changed",
        arr_a.dtype.str,
        arr_a.shape,
        arr_b.dtype.str,
        arr_b.shape,
        max_abs,
        max_rel,
        acc.n_changed,
        acc.close,
        acc.bitwise,
    )


def _assembled(src, side: tuple | int, path: str) -> np.ndarray:
    """The global array at `path`: leaf `side`, or assembled from the blocks
    ``side = (decomposition, leaf indices)`` (``blocks_of``)."""
    if isinstance(side, int):
        return _whole(src, side, path)
    decomposition, leaves = side
    return assemble(decomposition, [_whole(src, i, f"{path}[{r}]") for r, i in enumerate(leaves)])


def _whole(src, i, path) -> np.ndarray:
    if src[0] == "state":
        return src[1][i]
    source, m = src[1], src[2]
    return source.read_leaf(m, i, path)


def comparison(d: Diff, rtol: float, atol: float) -> Comparison:
    """The verdict of ``History.compare`` from the diff made with its tolerances."""
    first, reason = None, "equal"
    for ld in d.leaves:
        if ld.status in ("added", "removed", "reshaped") or not ld.close:
            first = ld
            reason = {
                "added": f"{ld.path} is only in {d.b}",
                "removed": f"{ld.path} is only in {d.a}",
                "reshaped": f"{ld.path} is {ld.dtype}{list(ld.shape)} in {d.a} and "
                f"{ld.other_dtype}{list(ld.other_shape)} in {d.b}",
            }.get(
                ld.status,
                f"{ld.path} differs by up to {ld.max_abs:.3g} (relative "
                f"{ld.max_rel:.3g}) in {ld.n_changed} elements"
                if ld.max_abs is not None
                else f"{ld.path} differs in {ld.n_changed} elements",
            )
            break
    bad_values = [(p, va, vb) for p, va, vb in d.values if not _values_close(va, vb, rtol, atol)]
    if first is None and bad_values:
        p, va, vb = bad_values[0]
        reason = f"{p} is {va!r} in {d.a} and {vb!r} in {d.b}"
    equal = first is None and not bad_values
    bitwise = not d.values and all(ld.bitwise and ld.status == "same" for ld in d.leaves)
    max_abs = max((ld.max_abs for ld in d.leaves if ld.max_abs is not None), default=0.0)
    max_rel = max((ld.max_rel for ld in d.leaves if ld.max_rel is not None), default=0.0)
    return Comparison(equal, bitwise, first, reason, max_abs, max_rel, rtol, atol, d)


def _values_close(va, vb, rtol, atol) -> bool:
    num = (int, float)
    if (
        isinstance(va, num)
        and isinstance(vb, num)
        and not isinstance(va, bool)
        and not isinstance(vb, bool)
    ):
        if va == vb or (va != va and vb != vb):
            return True
        return abs(va - vb) <= atol + rtol * abs(vb)
    return False


def _as_items(view: memoryview, dtype: np.dtype) -> np.ndarray:
    return (
        np.frombuffer(view, dtype=np.uint8).view(dtype)
        if dtype.itemsize
        else np.frombuffer(view, dtype=np.uint8)
    )
