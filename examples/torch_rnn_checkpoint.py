"""Train a GRU over a 2,000-step sequence with schedule-driven checkpointing.

The gradient of a recurrent network over a long sequence needs every step's
state again, in reverse order: plain autograd keeps all 2,000 tapes.
``checkpoint_sequence`` keeps a few snapshots instead, chosen by a vlcc
schedule, and recomputes the rest during the backward pass:

* Revolve with 45 snapshots (the default, ~sqrt(n)), one step at a time;
* ``plan_sequence``: blocks of steps + Revolve for a memory budget, never
  worse than ``checkpoint_sequential`` and usable far below its floor;
* a two-level ``Multistage`` schedule whose second level is a ``ZarrTier``
  on disk (snapshots that survive the process, read back by the store).

Run::

    python examples/torch_rnn_checkpoint.py          # ~1 minute on one core
"""

import tempfile
import time

import torch

from vlcc_adjoint import Level, Multistage, io_plan, simulate
from vlcc_adjoint.storage import DeviceTier, TieredStore, ZarrTier
from vlcc_adjoint.torch import checkpoint_sequence, plan_sequence

torch.set_num_threads(1)
torch.manual_seed(0)
n, batch, hidden = 2000, 16, 64

cell = torch.nn.GRUCell(1, hidden)
head = torch.nn.Linear(hidden, 1)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=3e-3)
t = torch.linspace(0, 40, n + 1)
phase = torch.rand(batch, 1) * 6.28
xs = torch.sin(t[:-1, None, None] + phase).float()  # (n, batch, 1)
target = torch.sin(t[-1] + phase)  # predict the next value


def loss_of(h):
    return (head(h) - target).square().mean()


def plain():
    h = torch.zeros(batch, hidden)
    for i in range(n):
        h = cell(xs[i], h)
    return h


def train(name, forward, iters=3):
    """A few Adam steps (the same model keeps training from one variant to the next)."""
    t0 = time.perf_counter()
    for _ in range(iters):
        opt.zero_grad()
        loss = loss_of(forward())
        loss.backward()
        opt.step()
    print(f"{name:34s} loss {loss.item():.4f}  {(time.perf_counter() - t0) / iters:.2f} s/iter")


# The same gradients, three ways (check one against plain autograd first).
h0 = torch.zeros(batch, hidden)
g_plain = torch.autograd.grad(loss_of(plain()), list(cell.parameters()))
g_ckpt = torch.autograd.grad(
    loss_of(checkpoint_sequence(cell, h0, n, inputs=xs)), list(cell.parameters())
)
print(
    "max |difference| to plain autograd:",
    max(float((a - b).abs().max()) for a, b in zip(g_plain, g_ckpt)),
)

train("plain autograd (2000 tapes)", plain)
train("Revolve, 45 snapshots", lambda: checkpoint_sequence(cell, h0, n, inputs=xs))

p = plan_sequence(n, memory=30)
train(
    f"plan_sequence(30): block {p.block}, {p.snapshots} snaps",
    lambda: checkpoint_sequence(cell, h0, n, inputs=xs, block=p.block, snapshots=p.snapshots),
)

schedule = Multistage(n, [Level(8, 0, 0), Level(16, 2, 2)])
print("multistage:", simulate(schedule).peak_slots, "slots per level")
# The store holds every level of the schedule and follows its plan: level 0 the
# tensors' own slots, level 1 the disk; restores from disk are read ahead.
with (
    tempfile.TemporaryDirectory() as d,
    TieredStore([DeviceTier(), ZarrTier(d)], plan=io_plan(schedule)) as store,
):
    train(
        "Multistage: 8 in memory + 16 on disk",
        lambda: checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store),
    )
    stats = store.stats()
    print(
        "disk level:",
        stats.tiers[1].puts,
        "writes,",
        stats.prefetch_hits + stats.staged_hits,
        "restores read ahead,",
        stats.prefetch_misses,
        "waited for",
    )
