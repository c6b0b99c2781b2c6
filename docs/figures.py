"""Figures of the Concepts page, drawn when the site is built (into $VLCC_DOCS_FIGURES)."""

import os
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np

from vlcc_adjoint.lineage import History
from vlcc_adjoint.plot import plot_schedule
from vlcc_adjoint.schedules import Revolve, simulate

out = os.environ.get("VLCC_DOCS_FIGURES", ".")

schedule = Revolve(12, 3)
print(simulate(schedule))
plot_schedule(schedule, os.path.join(out, "revolve_12_3.png"), title="Revolve(12, 3)")

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
nx.draw_networkx(g, pos, ax=ax, labels=labels, node_color="#cfe3f7", node_size=2400, font_size=7,
                 arrows=True)
ax.set_title("A history: main, and a branch from epoch 1")
ax.axis("off")
fig.tight_layout()
fig.savefig(os.path.join(out, "lineage_graph.png"), dpi=110)
