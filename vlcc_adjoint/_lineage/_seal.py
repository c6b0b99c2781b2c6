"""Seals: the digests that make a repository's metadata tamper-evident (format 2).

A lineage repository has three kinds of metadata a read depends on, and
each carries a digest (xxh3-128, :func:`vlcc_adjoint.storage.format.digest`):

* **A version's manifest** (``versions/<id>/zarr.json``): its attributes
  carry ``"digest"``, the digest of the canonical JSON of every other
  attribute: the state spec (structure, names, scalars, strings, the
  leaf-to-name mapping), per leaf the dtype, shape, chunk shape, codec
  configuration and chunk addresses (which are themselves the xxh3-128 of
  the chunks' bytes), and parents, branch, message, meta, created and
  origin.  The graph repeats the digest in the version's node, so a
  manifest replaced by another well-sealed one is caught too.
* **The graph** (``graph/zarr.json``): the file is written as the fixed
  text ``{"zarr_format":3,"node_type":"group","attributes":{"vlcc_lineage_graph":G,
  "vlcc_lineage_graph_digest":"<hex>"}}`` where ``<hex>`` is xxh3-128 of
  the bytes of ``G``.  Hashing ``G``'s bytes as written (rather than a
  canonical re-encoding) keeps a commit to a long history cheap: the graph
  text is assembled from cached fragments, and re-encoding thousands of
  versions on every publication is what the fragments avoid.
* **The root** (``zarr.json``): its attributes carry ``"digest"`` as a
  manifest does.

A reader verifies a seal before it interprets anything it covers.  A byte
changed anywhere in a sealed document is therefore either detected
(``CorruptCheckpointError`` naming the file) or outside what the reader
interprets: the zarr envelope (``zarr_format``, ``node_type``) is checked
for its exact values, and JSON whitespace or key order never changes the
parsed value.  Format 1 repositories (written before seals) are still
read (a writer that opens one seals its root as format 2, since the versions
and graph it adds are sealed): their documents have ``"format": 1`` and no
digest, and a sealed
document cannot pass for one by a single changed byte (the graph's format
number sits inside the hashed text; a version whose node records a digest
is only accepted with that digest).

The digests are checksums, not signatures (see
:mod:`vlcc_adjoint.storage.format`): they catch damage, and the bounds of
the reader (:mod:`._read`) keep a crafted repository from hanging or
exhausting it.

**Reference:** Y. Collet, *xxHash: extremely fast hash algorithm*, XXH3
specification (2019-2024).
"""

from __future__ import annotations

import json
import re

import xxhash

from ..errors import VlccValueError
from ..storage import format as SF
from ._format import GRAPH_KEY, corrupt

__all__ = [
    "GRAPH_KEY",
    "check_sealed",
    "graph_file_bytes",
    "parse_graph_file",
    "seal",
    "strict_loads",
]

_DIGEST = re.compile(r"[0-9a-f]{32}")
_GRAPH_HEAD = b'{"zarr_format":3,"node_type":"group","attributes":{"' + GRAPH_KEY.encode() + b'":'
_GRAPH_TAIL = re.compile(rb',"' + GRAPH_KEY.encode() + rb'_digest":"([0-9a-f]{32})"\}\}\Z')


def seal(attrs: dict) -> dict:
    """`attrs` with ``"digest"``: the digest of every other attribute."""
    body = {k: v for k, v in attrs.items() if k != "digest"}
    return {**body, "digest": SF.digest(body)}


def check_sealed(attrs, path: str, what: str, expected: str | None = None) -> str:
    """Verify the seal of `attrs` read from `path` (``CorruptCheckpointError`` naming it).

    `expected`: the digest another sealed document (the graph) records for
    it.  **Returns:** the digest.
    """
    if (
        not isinstance(attrs, dict)
        or not isinstance(attrs.get("digest"), str)
        or _DIGEST.fullmatch(attrs["digest"]) is None
    ):
        raise corrupt(path, f"{what} has no valid digest")
    body = {k: v for k, v in attrs.items() if k != "digest"}
    try:
        got = SF.digest(body)
    except ValueError as err:  # not encodable as JSON: cannot be what was sealed
        raise corrupt(path, f"{what} does not encode as JSON ({err})") from None
    if got != attrs["digest"]:
        raise corrupt(
            path,
            f"{what} has digest {got}, its seal says {attrs['digest']}: "
            "its metadata was changed after it was written",
        )
    if expected is not None and got != expected:
        raise corrupt(
            path,
            f"{what} has digest {got}, the graph records {expected}: "
            "it was replaced after it was written",
        )
    return got


def _reject_constant(name: str):
    raise VlccValueError(f"{name} is not valid in checkpoint metadata")


def _unique_keys(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        raise VlccValueError("duplicate key in an object")
    return out


def strict_loads(data: bytes, path: str):
    """Strict JSON (UTF-8, no ``NaN``, no duplicate keys) from bytes read from `path`."""
    try:
        return json.loads(
            data.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise corrupt(path, f"is not valid JSON metadata ({err})") from None


def graph_file_bytes(text: str) -> bytes:
    """``graph/zarr.json`` holding the graph's JSON `text`, sealed."""
    body = text.encode("ascii")
    return (
        _GRAPH_HEAD
        + body
        + b',"'
        + GRAPH_KEY.encode()
        + b'_digest":"'
        + xxhash.xxh3_128_hexdigest(body).encode()
        + b'"}}'
    )


def parse_graph_file(raw: bytes, path: str) -> dict:
    """The graph document (``{"format": ..., "graph": ...}``) in the bytes of `path`.

    A sealed file (format 2) must carry the right digest; a file without a
    seal is accepted only as format 1.
    """
    m = _GRAPH_TAIL.search(raw) if raw.startswith(_GRAPH_HEAD) else None
    if m is not None:
        body = raw[len(_GRAPH_HEAD) : m.start()]
        got = xxhash.xxh3_128_hexdigest(body)
        if got != m.group(1).decode():
            raise corrupt(
                path,
                f"the graph has digest {got}, its seal says "
                f"{m.group(1).decode()}: it was changed after it was written",
            )
        doc = strict_loads(body, path)
        if not (isinstance(doc, dict) and doc.get("format") == 2):
            raise corrupt(path, "the sealed graph is not of format 2")
        return doc
    doc = strict_loads(raw, path)
    if not (
        isinstance(doc, dict)
        and doc.get("zarr_format") == 3
        and doc.get("node_type") == "group"
        and isinstance(doc.get("attributes"), dict)
        and isinstance(doc["attributes"].get(GRAPH_KEY), dict)
    ):
        raise corrupt(
            path,
            "is not the graph of a lineage history (a zarr v3 group with "
            f"{GRAPH_KEY!r} attributes)",
        )
    graph = doc["attributes"][GRAPH_KEY]
    if graph.get("format") != 1 or len(doc["attributes"]) != 1 or len(doc) != 3:
        raise corrupt(path, "the graph has no valid seal (only format 1 graphs have none)")
    return graph
