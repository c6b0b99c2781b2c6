"""Draw a schedule the way the checkpointing literature does.

Step ``0 .. n`` runs along the horizontal axis and the action index down the
vertical one (time flows downwards, as in Griewank & Walther's figures):
each ``Advance`` is a horizontal stroke, saves and loads are triangles
coloured by storage level, adjoint steps are dots on the diagonal the
backward pass traces.  matplotlib is an optional dependency (the ``plot``
extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import VlccImportError, VlccValueError
from .schedules import ActionKind, Schedule

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["check_figure_path", "plot_schedule"]

_LEVEL_COLOURS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
)


def check_figure_path(path: str, what: str = "the figure") -> None:
    """Check, before any work, that a figure can be written to `path`.

    The directory must exist and accept a new file (probed by creating and
    removing a temporary file in it, which also catches read-only file
    systems), `path` must not be a directory, and its extension, if any,
    must be a format matplotlib writes.

    **Arguments:**

    - `path`: where the figure will go.
    - `what`: how error messages name the path (``"--png"``, ...).

    **Raises:** `ValueError` naming the problem and the remedy.
    """
    import os
    import tempfile
    from pathlib import Path

    target = Path(path)
    if not str(path):
        raise VlccValueError(f"{what}: the file name is empty")
    if target.is_dir():
        raise VlccValueError(
            f"{what} {path} is a directory; give a file name, e.g. {target / 'figure.png'}"
        )
    folder = target.parent
    if not folder.is_dir():
        raise VlccValueError(
            f"{what} {path}: the directory {folder} does not exist; create it "
            "or choose another path"
        )
    suffix = target.suffix[1:].lower()
    if suffix:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise VlccValueError(
                f"{what} {path}: drawing needs matplotlib: pip install 'vlcc-adjoint[plot]'"
            ) from None
        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise VlccValueError(
                f"{what} {path}: matplotlib cannot write .{suffix} files; use one "
                f"of {', '.join('.' + f for f in sorted(formats))}"
            )
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".vlcc-write-check-"):
            pass
    except OSError as err:
        raise VlccValueError(
            f"{what} {path}: cannot write in {folder} ({err.strerror}); choose a writable directory"
        ) from None
    if target.exists() and not os.access(target, os.W_OK):
        raise VlccValueError(f"{what} {path}: the file exists and is not writable")


def plot_schedule(
    schedule: Schedule, path: str | None = None, ax: Axes | None = None, title: str | None = None
) -> Axes:
    """Plot `schedule`; save to `path` if given; return the matplotlib axes.

    Tables of more than 200,000 actions are refused: a picture of them shows
    nothing and takes minutes to draw; plot a smaller instance instead.
    """
    try:
        import matplotlib

        if ax is None and path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.collections import LineCollection
    except ImportError:
        raise VlccImportError(
            "plotting a schedule needs matplotlib: pip install 'vlcc-adjoint[plot]'"
        ) from None
    t = schedule.table
    if len(t) > 200_000:
        raise VlccValueError(
            f"the schedule has {len(t):,} actions, too many to draw (at most 200,000); "
            "plot a schedule with fewer steps"
        )
    if ax is None:
        height = min(12.0, 3.0 + len(t) / 150)
        _, ax = plt.subplots(figsize=(7.0, height))
    rows = np.arange(len(t))
    kind = t["kind"]
    adv = kind == ActionKind.ADVANCE
    segments = np.stack(
        [np.stack([t["a"][adv], rows[adv]], 1), np.stack([t["b"][adv], rows[adv]], 1)], 1
    )
    ax.add_collection(LineCollection(list(segments), colors="0.3", linewidths=1.2, label="advance"))
    for lv in range(len(schedule.levels)):
        colour = _LEVEL_COLOURS[lv % len(_LEVEL_COLOURS)]
        for k, marker, what in ((ActionKind.SAVE, "v", "save"), (ActionKind.LOAD, "^", "load")):
            sel = (kind == k) & (t["level"] == lv)
            if sel.any():
                ax.scatter(
                    t["a"][sel],
                    rows[sel],
                    marker=marker,
                    s=18,
                    color=colour,
                    label=f"{what} (level {lv})",
                    zorder=3,
                )
    rev = kind == ActionKind.REVERSE
    ax.scatter(
        t["a"][rev] + 0.5,
        rows[rev],
        marker="o",
        s=10,
        color="tab:red",
        label="adjoint step",
        zorder=4,
    )
    ax.set_xlim(-0.5, schedule.n_steps + 0.5)
    ax.set_ylim(len(t), -1)
    ax.set_xlabel("step")
    ax.set_ylabel("action index")
    ax.set_title(title or repr(schedule))
    # beside the axes, so that it covers neither the actions nor the axis labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    if path is not None:
        figure = ax.figure.figure  # the figure itself, or the one holding a subfigure
        figure.tight_layout()
        figure.savefig(path, dpi=120, bbox_inches="tight")
    return ax
