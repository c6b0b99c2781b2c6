"""Training a language model with torch.distributed.checkpoint into a lineage History.

A tiny transformer (``vlcc_adjoint._examples.tiny_lm``, about 105 K
parameters, one CPU thread, deterministic) learns a generated grammar.  Every
``--every`` steps, the model and AdamW's state are saved with the familiar
call::

    dcp.save(state_dict, storage_writer=VlccWriter(repo, branch="main", step=s, meta={"loss": l}))

and each save becomes a version of one ``History``.  At step ``--spike-at``
a learning-rate spike (``--spike`` times the rate, for three steps) makes the
loss blow up.  The script then

1. detects it (a loss above 1.5x the best so far) and finds the last good
   version: the newest one saved before the first bad step;
2. restores it into a *fresh* model and optimizer with
   ``dcp.load(state_dict, storage_reader=VlccReader(repo, ref=good))``,
   opens the branch ``lr-capped`` there, and trains on with the rate capped at
   its value at that version (the spike is gone; everything before it is
   replayed unchanged, so the losses up to the spike are those of the
   original run, bit for bit);
3. tags the branch's last version ``pretrained``, and from that tag
   fine-tunes on a second task (two-digit additions, ``"27+58=85;"``) on the
   branch ``finetune-addition``;
4. prints ``vlcc log`` (the version graph: ``main`` diverged, the two
   branches) and ``vlcc diff`` of the tips of ``main`` and ``lr-capped``.

Run it (15-30 s on one core)::

    python examples/lineage_lm.py --repo /tmp/lm.vlcc && vlcc log /tmp/lm.vlcc
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from vlcc_adjoint._examples import tiny_lm as lm
from vlcc_adjoint.cli import Integer, Number, Parser
from vlcc_adjoint.cli import main as vlcc
from vlcc_adjoint.lineage import History
from vlcc_adjoint.torch.dcp import VlccReader, VlccWriter

# DCP warns that it runs in one process without a process group: that is the case here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def schedule(
    step: int, peak: float, spike_at: int, spike: float, warmup: int = 20, horizon: int = 400
) -> float:
    """Linear warm-up, cosine decay, and (the mistake) `spike` x the rate for 3 steps."""
    rate = (
        peak
        * min(1.0, (step + 1) / warmup)
        * 0.5
        * (1 + math.cos(math.pi * min(step, horizon) / horizon))
    )
    return rate * spike if spike_at <= step < spike_at + 3 else rate


def build(seed: int = 0) -> tuple[lm.TinyLM, torch.optim.AdamW]:
    model = lm.TinyLM(seed=seed)
    return model, torch.optim.AdamW(model.parameters(), weight_decay=0.0)


def save(writer: VlccWriter, model, optimizer, step: int, loss: float) -> str:
    """One DCP save through `writer`: a new version on its branch; **Returns:** its id."""
    msd, osd = get_state_dict(model, optimizer)
    writer.step, writer.meta = step, {"loss": loss}
    dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
    return writer.version


def restore(repo: str, ref: str, model, optimizer=None) -> None:
    """Load version `ref` into `model` and `optimizer` (in place) through DCP; without an
    optimizer, only the model's weights are read."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, storage_reader=VlccReader(repo, ref=ref))
        set_model_state_dict(model, state["model"])
        return
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=VlccReader(repo, ref=ref))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def train(
    repo, model, optimizer, data, steps, rate, every, branch, message, stop_on_divergence=False
):
    """Train over `steps`, saving every `every` steps on `branch` (versions named `message`).

    **Returns:** ``(losses, versions, first_bad)``: the loss of each step (before
    its update), ``{step: version id}`` of the saves (the state after ``step``
    steps), and the first step whose loss was above 1.5x the best (or None;
    with `stop_on_divergence`, the run is saved and stops there).
    """
    losses, versions, best = {}, {}, math.inf
    # one writer for the whole run: it keeps the history open between saves
    writer = VlccWriter(repo, branch=branch, message=message)
    for s in steps:
        x, y = lm.batch(data, s)
        loss = lm.train_step(model, optimizer, x, y, rate(s))
        losses[s] = loss
        bad = not math.isfinite(loss) or loss > 1.5 * best
        if (s + 1) % every == 0 or (bad and stop_on_divergence):
            versions[s + 1] = save(writer, model, optimizer, s + 1, loss)
        if bad and stop_on_divergence:
            writer.close()
            return losses, versions, s
        best = min(best, loss)
    writer.close()
    return losses, versions, None


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=Integer(1), default=200, help="training steps")
    parser.add_argument("--every", type=Integer(1), default=10, help="a DCP save every k steps")
    parser.add_argument("--peak", type=Number(above=0.0), default=3e-3, help="peak learning rate")
    parser.add_argument("--spike-at", type=Integer(0), default=125, help="first step of the spike")
    parser.add_argument("--spike", type=Number(above=0.0), default=30.0, help="the spike's factor")
    parser.add_argument("--finetune-steps", type=Integer(1), default=60, help="fine-tuning steps")
    parser.add_argument("--repo", help="the History directory (default: a temporary one)")
    parser.add_argument("--record", help="write the losses and version ids to this JSON file")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    lm.deterministic(0)
    grammar, addition = lm.corpus("grammar"), lm.corpus("addition", 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repo or os.path.join(tmp, "lm.vlcc")

        # 1. The original run, with the spike; it stops once the loss has blown up.
        spiky = lambda s: schedule(s, args.peak, args.spike_at, args.spike)  # noqa: E731
        model, opt = build()
        original, saved, first_bad = train(
            repo,
            model,
            opt,
            grammar,
            range(args.steps),
            spiky,
            args.every,
            "main",
            "pre-training",
            stop_on_divergence=True,
        )
        if first_bad is None:
            print(f"no divergence with a spike of {args.spike}x; nothing to backtrack")
            return {"diverged": False}
        good_step = max(s for s in saved if s <= first_bad)
        good = saved[good_step]
        print(
            f"main diverged at step {first_bad} (loss {original[first_bad]:.3f}, best "
            f"{min(original.values()):.3f}); last good version {good} (step {good_step})"
        )

        # 2. Backtrack: a fresh model and optimizer, restored from the good version.
        cap = schedule(good_step, args.peak, args.spike_at, 1.0)
        capped = lambda s: min(spiky(s), cap)  # noqa: E731
        with History(repo) as h:
            h.branch("lr-capped", at=good)
            h.tag("last-good", good)
        model, opt = build(seed=1)  # other initial weights: all that matters comes from `good`
        restore(repo, good, model, opt)
        branch_losses, branch_saved, _ = train(
            repo,
            model,
            opt,
            grammar,
            range(good_step, args.steps),
            capped,
            args.every,
            "lr-capped",
            "rate capped",
        )
        pretrained = branch_saved[max(branch_saved)]
        with History(repo) as h:
            h.tag("pretrained", pretrained)

        # 3. Fine-tune on the second task from the tagged version (a new optimizer).
        model, _ = build(seed=2)
        restore(repo, "pretrained", model)
        before = {"grammar": lm.evaluate(model, grammar), "addition": lm.evaluate(model, addition)}
        ft_opt = torch.optim.AdamW(model.parameters(), weight_decay=0.0)
        with History(repo) as h:
            h.branch("finetune-addition", at=pretrained)
        ft_losses, ft_saved, _ = train(
            repo,
            model,
            ft_opt,
            addition,
            range(args.finetune_steps),
            lambda s: 1e-3,
            20,
            "finetune-addition",
            "fine-tune",
        )
        after = {"grammar": lm.evaluate(model, grammar), "addition": lm.evaluate(model, addition)}

        # 4. The graph and the difference between the diverged and the capped run.
        print("\n$ vlcc log", repo)
        vlcc(["log", repo])
        print("\n$ vlcc diff", repo, "main lr-capped    # the model's rows")
        with contextlib.redirect_stdout(io.StringIO()) as text:
            vlcc(["diff", repo, "main", "lr-capped"])
        rows = text.getvalue().splitlines()
        optimizer_rows = [r for r in rows if "['optim." in r]
        print("\n".join(r for r in rows if r not in optimizer_rows))
        print(f"  ... and {len(optimizer_rows)} rows of AdamW's state")
        with History(repo, mode="r") as h:
            graph = {v.id: list(v.parents) for v in h.log(all=True)}
            branches, tags = dict(h.branches), dict(h.tags)
        equal = [s for s in branch_losses if s in original and branch_losses[s] == original[s]]
        print(
            f"\nreplayed from step {good_step}: losses of steps {min(equal)}..{max(equal)} "
            f"equal the original run's bit for bit; the capped branch ends at loss "
            f"{branch_losses[max(branch_losses)]:.3f} (step {max(branch_losses)})"
        )
        print(
            f"fine-tuned from 'pretrained' for {args.finetune_steps} steps: addition loss "
            f"{before['addition']:.3f} -> {after['addition']:.3f}, grammar loss "
            f"{before['grammar']:.3f} -> {after['grammar']:.3f}"
        )
        result = {
            "diverged": True,
            "first_bad": first_bad,
            "good_step": good_step,
            "good": good,
            "original_losses": original,
            "branch_losses": branch_losses,
            "main_versions": saved,
            "branch_versions": branch_saved,
            "finetune_versions": ft_saved,
            "finetune_losses": ft_losses,
            "pretrained": pretrained,
            "eval_before": before,
            "eval_after": after,
            "graph": graph,
            "branches": branches,
            "tags": tags,
        }
    if args.record:
        with open(args.record, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
