"""Refs: HEAD, branches, tags, ``ref~n``, and the commands that move them.

The part of :class:`~vlcc_adjoint.lineage.History` that names versions (a
mixin).  A ref is a branch (its tip), a tag, a version id or a unique prefix
of one (4+ characters), ``"HEAD"``, any of these followed by ``~n`` (``n``
first-parent steps back, as in git), or a :class:`Version`.  Branches and
tags live in the graph file: changing one is a read-modify-write of the
graph under ``locks/graph.lock`` (:mod:`._repo`), so two processes never
lose each other's updates.
"""

from __future__ import annotations

import networkx as nx

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ._graph import Graph, Version, check_name

__all__ = ["Refs"]


class Refs:
    """Refs of :class:`~vlcc_adjoint.lineage.History` (a mixin; see the module docstring)."""

    @property
    def head(self) -> str | None:
        """The branch this object commits to, or ``None`` when detached (after
        ``checkout`` of a version or tag)."""
        return self._head_branch

    @property
    def head_version(self) -> str | None:
        """The id of the version HEAD points at (``None`` in an empty branch)."""
        self._sync()
        return self._head_id(self._graph)

    def _head_id(self, g: Graph) -> str | None:
        if self._head_branch is None:
            return self._head_version
        return g.branches.get(self._head_branch)

    @property
    def branches(self) -> dict[str, str]:
        """``{branch name: tip version id}``."""
        return dict(self._sync().branches)

    @property
    def tags(self) -> dict[str, str]:
        """``{tag name: version id}``."""
        return dict(self._sync().tags)

    @property
    def graph(self) -> nx.DiGraph:
        """A copy of the version DAG (edges parent -> child; node attributes as in the file)."""
        return self._sync().g.copy()

    def __len__(self) -> int:
        return len(self._sync())

    def __contains__(self, ref) -> bool:
        try:
            self.resolve(ref)
        except KeyError:
            return False
        return True

    def resolve(self, ref: str | Version = "HEAD") -> str:
        """The version id a ref names.

        **Arguments:**

        - `ref`: a branch (its tip), a tag, a version id or a unique prefix of
          one (4+ characters), ``"HEAD"``, or any of these followed by ``~n``
          (``n`` first-parent steps back: ``"main~2"``), or a :class:`Version`.

        **Returns:** the version id; ``KeyError`` naming the known refs if none matches.
        """
        return self._resolve(self._sync(), ref)

    def _resolve(self, g: Graph, ref) -> str:
        if isinstance(ref, Version):
            ref = ref.id
        if not isinstance(ref, str):
            raise VlccTypeError(
                f"refs are strings (branch, tag, version id) or Version objects, "
                f"got {type(ref).__name__}"
            )
        base, _, back = ref.partition("~")
        steps = 0
        if _:
            if not back.isdigit() and back != "":
                raise VlccKeyError(f"bad ref {ref!r}: '~' must be followed by a number of steps")
            steps = int(back or 1)
        if base == "HEAD":
            vid = self._head_id(g)
            if vid is None:
                raise VlccKeyError(
                    f"HEAD (branch {self._head_branch!r}) has no versions yet; commit a state first"
                )
        elif base in g.branches:
            vid = g.branches[base]
        elif base in g.tags:
            vid = g.tags[base]
        elif base in g:
            vid = base
        else:
            matches = [v for v in g.nodes if len(base) >= 4 and v.startswith(base)]
            if len(matches) != 1:
                what = "is ambiguous" if matches else "names no branch, tag or version"
                raise VlccKeyError(
                    f"ref {base!r} {what}; branches: {sorted(g.branches)}, tags: "
                    f"{sorted(g.tags)} (ids: `vlcc log {self.path}`)"
                )
            vid = matches[0]
        for _i in range(steps):
            parents = g.nodes[vid]["parents"]
            if not parents:
                raise VlccKeyError(f"ref {ref!r} goes back past the first version")
            vid = parents[0]
        return vid

    def branch(self, name: str, at: str | Version = "HEAD", *, force: bool = False) -> str:
        """Create branch `name` at a version (``checkout(name)`` then switches to it).

        **Arguments:**

        - `name`: the new branch.
        - `at`: where it starts (a ref; default HEAD).
        - `force`: move an existing branch there (its later versions stay in
          the history until ``gc``).

        **Returns:** the id of the version the branch points at.
        """
        check_name(name, "branch")
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            vid = self._resolve(g, at)
            if name in g.branches and not force and g.branches[name] != vid:
                raise VlccValueError(
                    f"branch {name!r} exists (at {g.branches[name]}); pick another "
                    "name, or pass force=True to move it"
                )
            g.branches[name] = vid
            self._write_graph(g)
        return vid

    def delete_branch(self, name: str) -> None:
        """Remove branch `name` (its versions stay until a ``gc`` no longer keeps them)."""
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            if name not in g.branches:
                raise VlccKeyError(f"no branch {name!r}; branches: {sorted(g.branches)}")
            tip = g.branches.pop(name)
            self._write_graph(g)
        with self._lock:
            if self._head_branch == name:  # detach where the branch was
                self._head_branch, self._head_version = None, tip

    def tag(self, name: str, version: str | Version = "HEAD", *, force: bool = False) -> str:
        """Name a version (tags are kept by ``gc`` with ``KeepPolicy(tagged=True)``).

        **Returns:** the id of the tagged version.  An existing tag is moved
        only with ``force=True``.
        """
        check_name(name, "tag")
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            vid = self._resolve(g, version)
            if name in g.tags and not force and g.tags[name] != vid:
                raise VlccValueError(
                    f"tag {name!r} exists (on {g.tags[name]}); pick another name, "
                    "or pass force=True to move it"
                )
            g.tags[name] = vid
            self._write_graph(g)
        return vid

    def delete_tag(self, name: str) -> None:
        """Remove tag `name` (the version stays)."""
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            if name not in g.tags:
                raise VlccKeyError(f"no tag {name!r}; tags: {sorted(g.tags)}")
            del g.tags[name]
            self._write_graph(g)
