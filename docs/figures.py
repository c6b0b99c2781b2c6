"""Figures of the Concepts page, drawn when the site is built (into $VLCC_DOCS_FIGURES)."""

import os
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np

from vlcc_adjoint import Level, Multistage, io_plan, run_adjoint, timestep
from vlcc_adjoint.lineage import History
from vlcc_adjoint.plot import plot_schedule
from vlcc_adjoint.schedules import Revolve, simulate
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier

out = os.environ.get("VLCC_DOCS_FIGURES", ".")

schedule = Revolve(12, 3)
print(simulate(schedule))
plot_schedule(schedule, os.path.join(out, "revolve_12_3.png"), title="Revolve(12, 3)")

# The action table of Revolve(8, 2), row by row, beside its plot (same rows).
schedule = Revolve(8, 2)
fig, (tab, ax) = plt.subplots(
    1, 2, figsize=(10.5, 6.4), sharey=True, gridspec_kw={"width_ratios": [1.25, 1.0]}
)
tab.set_xlim(0, 1)
tab.axis("off")
fields = ("kind", "a", "b", "level")
tab.text(
    0.02,
    -1.2,
    f"{'row':>3}  {'table row':<24}  action",
    family="monospace",
    fontsize=7.5,
    weight="bold",
    va="center",
)
for i, (row, action) in enumerate(zip(schedule.table, schedule)):
    raw = "(" + ", ".join(f"{int(row[f])}" for f in fields) + ")"
    tab.text(0.02, i, f"{i:>3}  {raw:<24}  {action}", family="monospace", fontsize=7.5, va="center")
plot_schedule(schedule, ax=ax, title="Revolve(8, 2): the table (kind, a, b, level) and its plot")
ax.set_ylabel("")
fig.tight_layout()
fig.savefig(os.path.join(out, "revolve_8_2_table.png"), dpi=110, bbox_inches="tight")
plt.close(fig)

# A tier timeline: a two-level Multistage run, timing every read and write of
# the disk level against the forward and adjoint steps.
events = []  # (lane, what, start, end)


class TimedZarrTier(ZarrTier):
    """A ZarrTier that records when its writes and reads ran."""

    def put(self, key, record):
        t0 = time.perf_counter()
        super().put(key, record)
        events.append(("level 1 (zarr)", "write", t0, time.perf_counter()))

    def get(self, key):
        t0 = time.perf_counter()
        record = super().get(key)
        events.append(("level 1 (zarr)", "read (prefetch)", t0, time.perf_counter()))
        return record


@timestep
def step(u, i):
    t0 = time.perf_counter()
    time.sleep(0.004)  # a 4 ms time step
    events.append(("computation", "forward step", t0, time.perf_counter()))
    return 0.999 * u + 0.001


@step.adjoint
def step_adjoint(u, lam, i):
    t0 = time.perf_counter()
    time.sleep(0.004)
    events.append(("computation", "adjoint step", t0, time.perf_counter()))
    return 0.999 * lam


schedule = Multistage(60, [Level(2, 0.05, 0.05), Level(4, 2.0, 2.0)])
with tempfile.TemporaryDirectory() as tmp:
    # The read-ahead cache holds one 2 MiB state: disk reads must be prefetched one by one.
    store = TieredStore(
        [MemoryTier(), TimedZarrTier(os.path.join(tmp, "disk"))],
        plan=io_plan(schedule),
        prefetch_bytes=3 << 20,
    )
    result = run_adjoint(step, schedule, np.ones(1 << 18), adj_final=lambda u: u, store=store)
print(result.store_stats)
start = min(e[2] for e in events)
lanes = {"computation": 1, "level 1 (zarr)": 0}
colours = {
    "forward step": "0.55",
    "adjoint step": "tab:red",
    "write": "tab:orange",
    "read (prefetch)": "tab:blue",
}
fig, ax = plt.subplots(figsize=(8.4, 2.4))
for what, colour in colours.items():
    spans = [(t0 - start, max(t1 - t0, 2e-3)) for lane, w, t0, t1 in events if w == what]
    lane = next(lane for lane, w, _, _ in events if w == what)
    ax.broken_barh(spans, (lanes[lane] - 0.35, 0.7), color=colour, label=what)
ax.set_yticks(list(lanes.values()), list(lanes))
ax.set_xlabel("seconds")
ax.set_title(
    f"Multistage(60): 2 states in memory, 4 on disk; the caller waited "
    f"{result.store_stats.stall_seconds * 1e3:.0f} ms for storage",
    fontsize=9,
)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
fig.tight_layout()
fig.savefig(os.path.join(out, "tier_timeline.png"), dpi=110, bbox_inches="tight")
plt.close(fig)

with tempfile.TemporaryDirectory() as tmp:
    h = History(os.path.join(tmp, "run.vlcc"))
    w = np.zeros(4)
    for epoch in range(3):
        w = w + 1.0
        h.commit({"w": w, "epoch": epoch}, message=f"epoch {epoch}")
    h.branch("small-lr", at=h.log()[1].id)
    h.checkout("small-lr")
    for epoch in range(2, 4):
        w = w + 0.1
        h.commit({"w": w, "epoch": epoch}, message=f"epoch {epoch}, lr/10")
    g = h.graph
    labels = {v: h.version(v).message for v in g.nodes}
    h.close()
fig, ax = plt.subplots(figsize=(7, 2.6))
order = list(nx.topological_sort(g))
depth = {}
for v in order:
    depth[v] = max((depth[p] + 1 for p in g.predecessors(v)), default=0)
lane, pos = {}, {}
for v in order:
    parents = list(g.predecessors(v))
    siblings = [c for p in parents for c in g.successors(p)]
    lane[v] = lane[parents[0]] + siblings.index(v) if parents else 0
    pos[v] = (depth[v], -lane[v])
nx.draw_networkx(
    g, pos, ax=ax, labels=labels, node_color="#cfe3f7", node_size=2400, font_size=7, arrows=True
)
ax.set_title("A history: main, and a branch from epoch 1")
ax.axis("off")
fig.tight_layout()
fig.savefig(os.path.join(out, "lineage_graph.png"), dpi=110)
