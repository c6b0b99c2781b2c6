"""Refs: HEAD, branches, tags, ``ref~n``, and the commands that move them.

:class:`Refs` is the part of :class:`~vlcc_adjoint.lineage.History` that
names versions.  A ref is a branch (its tip), a tag, a version id or a
unique prefix of one (4+ characters), ``"HEAD"``, any of these followed by
``~n`` (``n`` first-parent steps back, as in git), or a :class:`Version`.
Branches and tags live in the graph file: changing one is a
read-modify-write of the graph under ``locks/graph.lock``
(:class:`~._repo.Repository`), so two processes never lose each other's
updates.  HEAD is this object's: the branch it commits to (or, detached,
the version it checked out), and the tips of its own commits still in
flight (so that consecutive commits chain before the first is published).
"""

from __future__ import annotations

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ._graph import Graph, Version, check_name
from ._repo import Repository

__all__ = ["Refs"]

#: What names a version: a ref string or a :class:`Version`.
Ref = str | Version


class Refs:
    """HEAD and the refs of the repository `repo` (see the module docstring).

    **Attributes:** `head_branch` (the branch HEAD is on, ``None`` when
    detached), `head_version` (the version a detached HEAD is at), `tips`
    (branch -> this object's last commit to it that is not published yet);
    all guarded by the repository's instance lock.
    """

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.head_branch: str | None = repo.graph.head
        self.head_version: str | None = None  # when detached
        self.tips: dict[str, str] = {}

    def head_id(self, g: Graph) -> str | None:
        """The id of the version HEAD points at in graph `g` (``None``: an empty branch)."""
        if self.head_branch is None:
            return self.head_version
        return g.branches.get(self.head_branch)

    def base(self, g: Graph) -> str | None:
        """The version a new commit on HEAD's branch goes onto: this object's last
        commit to it (published or not), else HEAD's version (lock held)."""
        if self.head_branch is not None:
            return self.tips.get(self.head_branch) or self.head_id(g)
        return self.head_version

    def target_branch(self, branch: str | None, remedy: str) -> str:
        """The branch a new version goes onto: `branch` (a valid name) or HEAD's;
        a detached HEAD raises ``ValueError`` ending with `remedy` (lock held)."""
        if branch is not None:
            check_name(branch, "branch")
            return branch
        if self.head_branch is None:
            raise VlccValueError(f"HEAD is detached at version {self.head_version}{remedy}")
        return self.head_branch

    def resolve(self, g: Graph, ref: Ref) -> str:
        """The version id `ref` names in graph `g` (``KeyError`` naming the known refs)."""
        if isinstance(ref, Version):
            ref = ref.id
        if not isinstance(ref, str):
            raise VlccTypeError(
                f"refs are strings (branch, tag, version id) or Version objects, "
                f"got {type(ref).__name__}"
            )
        base, tilde, back = ref.partition("~")
        steps = 0
        if tilde:
            if not back.isdigit() and back != "":
                raise VlccKeyError(f"bad ref {ref!r}: '~' must be followed by a number of steps")
            steps = int(back or 1)
        vid: str | None
        if base == "HEAD":
            vid = self.head_id(g)
            if vid is None:
                raise VlccKeyError(
                    f"HEAD (branch {self.head_branch!r}) has no versions yet; commit a state first"
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
                    f"{sorted(g.tags)} (ids: `vlcc log {self.repo.path}`)"
                )
            vid = matches[0]
        for _i in range(steps):
            parents = g.nodes[vid]["parents"]
            if not parents:
                raise VlccKeyError(f"ref {ref!r} goes back past the first version")
            vid = parents[0]
        return vid

    # -- moving HEAD -------------------------------------------------------------------

    def check_out(self, g: Graph, ref: Ref, vid: str) -> None:
        """Move HEAD after `ref` (resolved to `vid` in `g`) was restored: onto a
        branch, or detached at `vid`; the repository's HEAD follows a branch."""
        name = ref.id if isinstance(ref, Version) else ref
        if name == "HEAD" and self.head_branch is not None:
            name = self.head_branch  # stay on the current branch
        repo = self.repo
        with repo.lock:
            if name in g.branches:
                self.head_branch, self.head_version = name, None
            else:
                self.head_branch, self.head_version = None, vid
            self.tips.clear()
        if name in g.branches and repo.mode == "a" and g.head != name:
            with repo.graph_lock.held():
                fresh = repo.fresh()
                if fresh.head != name:
                    fresh.head = name
                    repo.write_graph(fresh)

    def switch(self, branch: str) -> None:
        """HEAD onto `branch` (a commit with ``branch=`` makes it current; lock held)."""
        self.head_branch, self.head_version = branch, None

    def forget_version(self, vid: str) -> None:
        """Version `vid` was removed (gc): a detached HEAD there points nowhere."""
        with self.repo.lock:
            if self.head_version == vid:
                self.head_version = None

    # -- branches and tags -----------------------------------------------------------

    def branch(self, name: str, at: Ref = "HEAD", *, force: bool = False) -> str:
        """``History.branch``: create (or, with `force`, move) branch `name` at `at`."""
        check_name(name, "branch")
        repo = self.repo
        with repo.graph_lock.held():
            g = repo.fresh()
            vid = self.resolve(g, at)
            if name in g.branches and not force and g.branches[name] != vid:
                raise VlccValueError(
                    f"branch {name!r} exists (at {g.branches[name]}); pick another "
                    "name, or pass force=True to move it"
                )
            g.branches[name] = vid
            repo.write_graph(g)
        return vid

    def delete_branch(self, name: str) -> None:
        """``History.delete_branch``: remove branch `name`; a HEAD on it detaches."""
        repo = self.repo
        with repo.graph_lock.held():
            g = repo.fresh()
            if name not in g.branches:
                raise VlccKeyError(f"no branch {name!r}; branches: {sorted(g.branches)}")
            tip = g.branches.pop(name)
            repo.write_graph(g)
        with repo.lock:
            if self.head_branch == name:  # detach where the branch was
                self.head_branch, self.head_version = None, tip

    def tag(self, name: str, version: Ref = "HEAD", *, force: bool = False) -> str:
        """``History.tag``: name version `version` (an existing tag moves with `force`)."""
        check_name(name, "tag")
        repo = self.repo
        with repo.graph_lock.held():
            g = repo.fresh()
            vid = self.resolve(g, version)
            if name in g.tags and not force and g.tags[name] != vid:
                raise VlccValueError(
                    f"tag {name!r} exists (on {g.tags[name]}); pick another name, "
                    "or pass force=True to move it"
                )
            g.tags[name] = vid
            repo.write_graph(g)
        return vid

    def delete_tag(self, name: str) -> None:
        """``History.delete_tag``: remove tag `name` (the version stays)."""
        repo = self.repo
        with repo.graph_lock.held():
            g = repo.fresh()
            if name not in g.tags:
                raise VlccKeyError(f"no tag {name!r}; tags: {sorted(g.tags)}")
            del g.tags[name]
            repo.write_graph(g)
