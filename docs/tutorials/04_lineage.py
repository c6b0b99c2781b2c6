"""Lineage: commit, branch, checkout, diff

A `History` keeps versions of a state as a branching history. Here a
"training run" commits three versions on `main`, goes back to the second one,
branches with a different update, and compares the two tips leaf by leaf.
"""

import os
import tempfile

import numpy as np

from vlcc_adjoint.lineage import History

with tempfile.TemporaryDirectory() as tmp:
    h = History(os.path.join(tmp, "run.vlcc"))
    w = np.zeros(1000)
    for epoch in range(3):
        w = w + 0.5
        h.commit(
            {"w": w, "epoch": epoch},
            message=f"epoch {epoch}",
            meta={"loss": float(1 / (1 + epoch))},
        )

    second = h.log()[1]  # newest first: epoch 2, epoch 1, epoch 0
    print("branching at", second.message, second.meta)
    h.branch("small-step", at=second.id)
    state = h.checkout("small-step")
    print("checked out epoch", state["epoch"], "w[0] =", state["w"][0])
    w = state["w"].copy()
    w[:10] += 0.05
    h.commit({"w": w, "epoch": state["epoch"] + 1}, message="epoch 2, small step")

    print(h.draw())
    d = h.diff("main", "small-step")
    print(d)
    h.close()
