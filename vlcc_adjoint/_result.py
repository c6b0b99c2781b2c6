"""What :func:`vlcc_adjoint.execute.run_adjoint` returns, and its printed form:
summaries of the states (dtype, shape, statistics), never their contents."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .schedules import ScheduleStats

__all__ = ["AdjointResult", "summary"]


@dataclasses.dataclass(frozen=True, repr=False)
class AdjointResult:
    """What :func:`~vlcc_adjoint.execute.run_adjoint` computed and what it cost.

    **Attributes:**

    - `adjoint`: ``lambda_0``, the gradient of the objective with respect
      to ``u_0``.
    - `final_state`: ``u_n``, the end of the forward sweep.
    - `schedule_stats`: :class:`~vlcc_adjoint.schedules.ScheduleStats` of the
      schedule that ran.
    - `store_stats`: the store's ``stats()`` at the end of the run.
    - `forward_steps`: forward steps evaluated (the schedule's forward count,
      plus one when ``u_n`` was computed for the objective).
    - `forward_seconds`, `adjoint_seconds`: time inside the solver's forward
      and adjoint calls.
    - `stall_seconds`: time the executor waited in store calls (save, load,
      delete, move, and the final flush).
    - `wall_seconds`: the whole run.
    - `error_estimate`: with ``gradient_rtol``, the estimated relative L2
      error of the gradient against exact checkpoints; else ``None``.
    - `compression_ratio`: with ``gradient_rtol``, raw over encoded bytes
      of the checkpoints the lossy levels stored in this run; else ``None``.
    - `error_budget`: with ``gradient_rtol``, the controller's
      :class:`~vlcc_adjoint.execute.ErrorBudgetReport` (the bound chosen,
      every run, the totals); else ``None``.
    """

    adjoint: Any
    final_state: Any
    schedule_stats: ScheduleStats
    store_stats: Any
    forward_steps: int
    forward_seconds: float
    adjoint_seconds: float
    stall_seconds: float
    wall_seconds: float
    error_estimate: float | None = None
    compression_ratio: float | None = None
    error_budget: Any = None

    @property
    def n_steps(self) -> int:
        return self.schedule_stats.n_steps

    def __repr__(self) -> str:
        # Summaries, not contents: a state may hold gigabytes.
        parts = [f"n_steps={self.n_steps}"]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name in _BUDGET_FIELDS:
                continue  # a run without a gradient budget
            if field.name in ("adjoint", "final_state"):
                text = summary(value)
            elif field.name in ("schedule_stats", "store_stats", "error_budget"):
                text = f"<{type(value).__name__}>"
            elif isinstance(value, float):
                text = f"{value:.4g}"
            else:
                text = summary(value)
            parts.append(f"{field.name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"


_BUDGET_FIELDS = ("error_estimate", "compression_ratio", "error_budget")
_SUMMARY_ITEMS = 8  # container entries shown before "..."


def _array_summary(x: np.ndarray) -> str:
    """``float64[300, 300] min=.. max=.. mean=..`` (nan/inf counted apart)."""
    head = f"{x.dtype}[{', '.join(str(d) for d in x.shape)}]"
    if x.size == 0 or x.dtype.kind not in "biufc":
        return head
    if x.dtype.kind == "b":
        return f"{head} true={int(np.count_nonzero(x))}"
    values = np.abs(x) if x.dtype.kind == "c" else x
    notes = []
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        nan = int(np.count_nonzero(np.isnan(values)))
        inf = values.size - int(np.count_nonzero(finite)) - nan
        notes = [f"nan={nan}"] * bool(nan) + [f"inf={inf}"] * bool(inf)
        if nan or inf:
            values = values[finite]
    if values.size:
        label = "|x| " if x.dtype.kind == "c" else ""
        notes.insert(
            0,
            f"{label}min={values.min():.4g} max={values.max():.4g} "
            f"mean={values.mean(dtype=np.float64):.4g}",
        )
    return " ".join([head] + notes)


def summary(x, depth: int = 0) -> str:
    """A one-line description of a state: arrays by dtype, shape and
    statistics, containers entry by entry (a few), scalars by value."""
    if isinstance(x, np.ndarray):
        return _array_summary(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # JAX / torch: no device transfer
        return f"{type(x).__name__} {x.dtype}[{', '.join(str(d) for d in x.shape)}]"
    if depth > 3:
        return "..."
    if isinstance(x, dict):
        items = [f"{k!r}: {summary(v, depth + 1)}" for k, v in list(x.items())[:_SUMMARY_ITEMS]]
        return "{" + ", ".join(items + ["..."] * (len(x) > _SUMMARY_ITEMS)) + "}"
    if isinstance(x, (list, tuple)):
        items = [summary(v, depth + 1) for v in x[:_SUMMARY_ITEMS]]
        text = ", ".join(items + ["..."] * (len(x) > _SUMMARY_ITEMS))
        return f"[{text}]" if isinstance(x, list) else f"({text})"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = dataclasses.fields(x)
        items = [
            f"{f.name}={summary(getattr(x, f.name), depth + 1)}" for f in fields[:_SUMMARY_ITEMS]
        ]
        return f"{type(x).__name__}({', '.join(items + ['...'] * (len(fields) > _SUMMARY_ITEMS))})"
    text = repr(x)
    return text if len(text) <= 60 else f"<{type(x).__name__}>"
