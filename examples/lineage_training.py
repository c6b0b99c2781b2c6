"""Recipe 5: training backtracks to the last good checkpoint and branches.

A small numpy MLP (1-32-32-1, tanh) learns ``sin(x)`` by full-batch gradient
descent, with the learning rate warming up linearly towards ``--lr-max``.
Too large a rate makes the loss diverge.  Every few epochs the parameters
(and the epoch counter) are committed with the loss and the rate as metadata;
when the loss blows up, the script

1. finds the last good version: the best loss on ``main`` (``log`` + ``meta``),
2. creates a branch there with a smaller, constant rate
   (``branch("lr-0.05", at=good)``, ``checkout("lr-0.05")``),
3. trains on: the loss keeps falling,

and ``History.draw()`` (``vlcc log``) shows both branches: the diverged
``main`` and the branch that went on.  ``gc`` with
``KeepPolicy(last=2, best=("loss", "min"))`` then keeps the tips, the best
version and little else.  (Non-finite losses are stored in the metadata as
the string ``"nan"``/``"inf"``: metadata is strict JSON.)

Run it::

    python examples/lineage_training.py --repo /tmp/mlp.vlcc && vlcc log /tmp/mlp.vlcc
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from vlcc_adjoint.cli import Integer, Number, Parser
from vlcc_adjoint.lineage import History, KeepPolicy


def dataset(n: int = 256):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3.0, 3.0, (n, 1))
    return x, np.sin(x) + 0.05 * rng.standard_normal((n, 1))


def init_params(width: int = 32) -> dict:
    rng = np.random.default_rng(1)
    return {
        "w1": rng.standard_normal((1, width)),
        "b1": np.zeros(width),
        "w2": rng.standard_normal((width, width)) / np.sqrt(width),
        "b2": np.zeros(width),
        "w3": rng.standard_normal((width, 1)) / np.sqrt(width),
        "b3": np.zeros(1),
    }


def loss_and_grad(p: dict, x: np.ndarray, y: np.ndarray):
    """Mean squared error and its gradient (hand-written backpropagation)."""
    with np.errstate(all="ignore"):  # a diverging run overflows; that is the point
        h1 = np.tanh(x @ p["w1"] + p["b1"])
        h2 = np.tanh(h1 @ p["w2"] + p["b2"])
        r = h2 @ p["w3"] + p["b3"] - y
        loss = float(np.mean(r**2))
        d3 = 2.0 * r / len(x)
        d2 = (d3 @ p["w3"].T) * (1.0 - h2**2)
        d1 = (d2 @ p["w2"].T) * (1.0 - h1**2)
        grad = {
            "w3": h2.T @ d3,
            "b3": d3.sum(0),
            "w2": h1.T @ d2,
            "b2": d2.sum(0),
            "w1": x.T @ d1,
            "b1": d1.sum(0),
        }
    return loss, grad


def train(h: History, state: dict, epochs: int, lr, every: int, x, y, stop_on_divergence: bool):
    """Gradient descent for `epochs` epochs, committing every `every`; `lr(epoch)` is the rate.

    **Returns:** ``(state, diverged)``.
    """
    best = math.inf
    for _ in range(epochs):
        rate = lr(state["epoch"])
        loss, grad = loss_and_grad(state["params"], x, y)
        with np.errstate(all="ignore"):
            for k, g in grad.items():
                state["params"][k] = state["params"][k] - rate * g
        state["epoch"] += 1
        diverged = not math.isfinite(loss) or loss > 4.0 * best
        if state["epoch"] % every == 0 or diverged:
            h.commit(
                state,
                message=f"epoch {state['epoch']}",
                meta={"epoch": state["epoch"], "loss": loss, "lr": rate},
            )
        best = min(best, loss)
        if diverged and stop_on_divergence:
            return state, True
    return state, False


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lr-max", type=Number(above=0.0), default=0.5, help="warm-up target (too large)"
    )
    parser.add_argument("--warmup", type=Integer(1), default=150, help="warm-up epochs")
    parser.add_argument(
        "--lr-small", type=Number(above=0.0), default=0.05, help="the rate of the new branch"
    )
    parser.add_argument("--epochs", type=Integer(1), default=120, help="epochs on the new branch")
    parser.add_argument("--every", type=Integer(1), default=5, help="commit every k epochs")
    parser.add_argument("--repo", help="the History directory (default: a temporary one)")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    x, y = dataset()
    with (
        tempfile.TemporaryDirectory() as tmp,
        History(args.repo or os.path.join(tmp, "mlp.vlcc")) as h,
    ):
        state = {"params": init_params(), "epoch": 0}
        warm = lambda e: 0.02 + (args.lr_max - 0.02) * min(1.0, e / args.warmup)  # noqa: E731
        state, diverged = train(h, state, 10 * args.warmup, warm, args.every, x, y, True)
        if not diverged:
            print(f"lr_max={args.lr_max} did not diverge; nothing to backtrack")
            return {"diverged": False}

        # Backtrack: the best version of main, judged by the committed loss.
        scored = [v for v in h.log("main") if isinstance(v.meta.get("loss"), float)]
        good = min(scored, key=lambda v: v.meta["loss"])
        name = f"lr-{args.lr_small:g}"
        h.branch(name, at=good.id)
        h.tag("best-before-divergence", good.id)
        state = h.checkout(name)
        state, _ = train(h, state, args.epochs, lambda e: args.lr_small, args.every, x, y, False)
        final_loss, _ = loss_and_grad(state["params"], x, y)
        h.commit(
            state,
            message=f"final (lr {args.lr_small:g})",
            meta={"epoch": state["epoch"], "loss": final_loss, "lr": args.lr_small},
        )
        drawing = h.draw()
        print(drawing)
        report = h.gc(keep=KeepPolicy(last=2, tagged=True, best=("loss", "min")))
        print(report)
        result = {
            "diverged": True,
            "good": good.id,
            "good_loss": good.meta["loss"],
            "good_epoch": good.meta["epoch"],
            "diverged_loss": h.version("main").meta["loss"],
            "final_loss": final_loss,
            "branches": sorted(h.branches),
            "drawing": drawing,
            "kept_after_gc": [v.id for v in h.log(all=True)],
            "gc": report,
        }
    print(
        f"main diverged (loss {result['diverged_loss']}); backtracked to epoch "
        f"{result['good_epoch']} (loss {result['good_loss']:.4f}), branched {name}: final loss "
        f"{final_loss:.4f}"
    )
    return result


if __name__ == "__main__":
    main()
