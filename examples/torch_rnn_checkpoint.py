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
    python examples/torch_rnn_checkpoint.py --steps 500 --iterations 1
"""

import tempfile
import time

import torch

from vlcc_adjoint import Level, Multistage, io_plan, simulate
from vlcc_adjoint.cli import Integer, Parser
from vlcc_adjoint.storage import DeviceTier, TieredStore, ZarrTier
from vlcc_adjoint.torch import checkpoint_sequence, plan_sequence


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=Integer(60, why="shorter, the Multistage schedule needs no disk"),
        default=2000,
        help="length of the sequence",
    )
    parser.add_argument("--batch", type=Integer(1), default=16, help="sequences per batch")
    parser.add_argument("--hidden", type=Integer(1), default=64, help="GRU features")
    parser.add_argument(
        "--iterations", type=Integer(1), default=3, help="Adam steps of each variant"
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    n, batch, hidden = args.steps, args.batch, args.hidden
    torch.set_num_threads(1)
    torch.manual_seed(0)
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

    def train(name, forward):
        """A few Adam steps (the same model keeps training from one variant to the next)."""
        t0 = time.perf_counter()
        for _ in range(args.iterations):
            opt.zero_grad()
            loss = loss_of(forward())
            loss.backward()
            opt.step()
        seconds = (time.perf_counter() - t0) / args.iterations
        print(f"{name:34s} loss {loss.item():.4f}  {seconds:.2f} s/iter")

    # The same gradients, three ways (check one against plain autograd first).
    h0 = torch.zeros(batch, hidden)
    g_plain = torch.autograd.grad(loss_of(plain()), list(cell.parameters()))
    g_ckpt = torch.autograd.grad(
        loss_of(checkpoint_sequence(cell, h0, n, inputs=xs)), list(cell.parameters())
    )
    difference = max(float((a - b).abs().max()) for a, b in zip(g_plain, g_ckpt))
    print("max |difference| to plain autograd:", difference)

    train(f"plain autograd ({n} tapes)", plain)
    train("Revolve, default snapshots", lambda: checkpoint_sequence(cell, h0, n, inputs=xs))

    p = plan_sequence(n, memory=30)
    train(
        f"plan_sequence(30): block {p.block}, {p.snapshots} snaps",
        lambda: checkpoint_sequence(cell, h0, n, inputs=xs, block=p.block, snapshots=p.snapshots),
    )

    schedule = Multistage(n, [Level(8, 0, 0), Level(16, 2, 2)])
    print("multistage:", simulate(schedule).peak_slots, "slots per level")
    # The store holds every level of the schedule and follows its plan: level 0
    # the tensors' own slots, level 1 the disk; restores from disk are read ahead.
    with (
        tempfile.TemporaryDirectory(prefix="vlcc-example-") as d,
        TieredStore([DeviceTier(), ZarrTier(d)], plan=io_plan(schedule)) as store,
    ):
        train(
            "Multistage: 8 in memory + 16 on disk",
            lambda: checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store),
        )
        stats = store.stats()
        disk = stats.tiers[1]
        print(
            "disk level:",
            disk.puts,
            "writes,",
            disk.gets,
            "reads,",
            stats.prefetch_hits + stats.staged_hits,
            "restores read ahead,",
            stats.prefetch_misses,
            "waited for",
        )
    return {"difference": difference, "disk_writes": disk.puts, "disk_reads": disk.gets}


if __name__ == "__main__":
    main()
