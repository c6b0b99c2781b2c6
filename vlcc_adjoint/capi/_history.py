"""A versioned lineage of protected regions: the Python side of ``vlcc_history``.

A C or Fortran program protects its regions once, then commits them as
versions and checks versions out into them.  The history is a
:class:`vlcc_adjoint.lineage.History`, in its format: a version committed
here is the dict ``{name: array}`` of the regions, so that
``History(path).load(version)`` in Python returns that dict, plain zarr
and other zarr v3 readers read its arrays (``versions/<id>/<i>``), and a
version committed from Python as a dict of arrays with the regions' names
is checked out here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import VlccValueError
from ..lineage import History
from ..storage import format as F
from ._header import constant
from ._regions import Regions
from ._run import CallOrderError

__all__ = ["RegionHistory"]

#: The modes of ``vlcc_history_open``.
MODES = ("r", "a", "w")

#: The attribute that marks a directory's root ``zarr.json`` as a history.
LINEAGE_ATTRIBUTE = "vlcc_lineage"


class RegionHistory:
    """A :class:`~vlcc_adjoint.lineage.History` whose states are protected regions.

    **Arguments:**

    - `path`: the repository directory.
    - `mode`: ``"r"`` (read only), ``"a"`` (read and write; created if
      missing) or ``"w"`` (a new, empty history: a history already at
      `path` is emptied first; a directory holding anything else is
      refused, never emptied).
    """

    def __init__(self, path: str, mode: str) -> None:
        if mode not in MODES:
            raise VlccValueError(
                f"mode must be 'r' (read only), 'a' (read and write) or 'w' (a new, "
                f"empty history), got {mode!r}"
            )
        if mode == "w":
            empty_history(path)
        self.history = History(path, mode="r" if mode == "r" else "a")
        self.regions = Regions()
        self.closed = False

    def protect(self, name: str, address: int, dtype: str, shape: Sequence[int]) -> None:
        """Add a region (``vlcc_history_protect``; see :meth:`Regions.protect`)."""
        self._check_open()
        self.regions.protect(name, address, dtype, shape)

    def commit(self, branch: str | None, message: str, size: int) -> str:
        """Commit the regions as a new version; return its id (``vlcc_history_commit``).

        **Arguments:**

        - `branch`: the branch to commit to, or ``None`` (or ``""``) for
          the current one.
        - `message`: the version's message.
        - `size`: the bytes of the caller's buffer for the id, its NUL
          included (checked before anything is committed).

        The regions are hashed, and their new chunks copied, before this
        returns (the program may change them at once); the version is
        written in the background and is visible once complete.
        """
        self._check_open()
        if not self.regions:
            raise CallOrderError(
                "vlcc_history_commit before any region is protected; protect the "
                "state's memory with vlcc_history_protect first"
            )
        need = constant("VLCC_VERSION_SIZE")
        if size < need:
            raise VlccValueError(
                f"the buffer for the version id has {size} bytes; it needs {need} (the "
                "id and the NUL): pass VLCC_VERSION_SIZE bytes"
            )
        version = self.history.commit(self.regions.state, message, branch=branch or None)
        if len(version) >= size:  # pragma: no cover - ids are 12 characters
            raise VlccValueError(
                f"version {version} was committed, but its id does not fit the "
                f"buffer of {size} bytes"
            )
        return version

    def checkout(self, ref: str) -> None:
        """Fill the regions with the version `ref` names (a version id, a
        branch, a tag, ``"HEAD~1"``...), as
        :meth:`~vlcc_adjoint.lineage.History.checkout` does: a branch becomes
        the current one, anything else detaches HEAD (a commit then names
        its branch) (``vlcc_history_checkout``).  A version whose arrays do
        not match the regions (names, dtypes, shapes) leaves the regions
        untouched, HEAD moved."""
        self._check_open()
        if not self.regions:
            raise CallOrderError(
                "vlcc_history_checkout before any region is protected; protect the "
                "regions to fill with vlcc_history_protect first"
            )
        self.regions.fill(self.history.checkout(ref), f"version {ref!r}")

    def close(self) -> None:
        """Finish pending commits and close the history (``vlcc_history_close``).
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.regions.clear()
        self.history.close()

    def _check_open(self) -> None:
        if self.closed:
            raise CallOrderError("this history is closed; open it again with vlcc_history_open")


def empty_history(path: str) -> None:
    """Make `path` an empty directory for a new history: remove what a
    history there holds (never following links), create it if missing;
    refuse a directory that holds anything else, or a link."""
    path = os.path.abspath(path)
    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        return
    F.check_dir(path)
    if not entries:
        return
    try:
        root = F.read_json(os.path.join(path, "zarr.json"))
    except (OSError, ValueError):
        root = None
    attributes = root.get("attributes") if isinstance(root, dict) else None
    if not isinstance(attributes, dict) or LINEAGE_ATTRIBUTE not in attributes:
        raise VlccValueError(
            f"{path} is not empty and holds no history; mode 'w' empties a history only. "
            "Give a new or empty directory, or open the history there with mode 'a'"
        )
    for entry in entries:
        F.remove_tree(os.path.join(path, entry), path)
