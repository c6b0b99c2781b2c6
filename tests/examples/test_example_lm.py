"""``examples/lineage_lm.py``: a language model trained through DCP into a History diverges,
backtracks, branches and is fine-tuned from a tag; each claim checked against the repository.

The script runs once, as a user would start it (a fresh interpreter), with
``--repo`` and ``--record``; the tests then read its repository with
``History`` and ``VlccReader`` and replay training steps in fresh interpreters of their own.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: E402

from vlcc_adjoint._examples import tiny_lm as lm  # noqa: E402
from vlcc_adjoint.lineage import History  # noqa: E402
from vlcc_adjoint.torch.dcp import VlccReader  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "lineage_lm.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    repo, record = tmp / "lm.vlcc", tmp / "run.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", str(repo), "--record", str(record)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(record.read_text())
    for key in (
        "original_losses",
        "branch_losses",
        "finetune_losses",
        "main_versions",
        "branch_versions",
        "finetune_versions",
    ):
        result[key] = {int(k): v for k, v in result[key].items()}
    return {"repo": str(repo), "out": done.stdout, "result": result}


def _weights(repo: str, ref: str, seed: int = 5) -> dict:
    """The model weights of version `ref`, read by DCP into a model of other initial weights."""
    model = lm.TinyLM(seed=seed)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=VlccReader(repo, ref=ref))
    return state["model"]


def test_the_spike_diverges_and_the_last_good_version_is_before_it(run):
    r = run["result"]
    assert r["diverged"] and r["first_bad"] >= 125  # the spike starts at step 125
    original = r["original_losses"]
    assert original[r["first_bad"]] > 1.5 * min(original[s] for s in original if s < r["first_bad"])
    assert r["good_step"] == 120 and r["main_versions"][120] == r["good"]
    assert r["tags"]["last-good"] == r["good"]


def test_losses_after_backtracking_equal_the_original_runs_up_to_the_branch_point(run):
    r = run["result"]
    original, branch = r["original_losses"], r["branch_losses"]
    # From the good version (step 120) to the spike (step 125) the branch runs the same rate:
    # the losses (each computed before its step's update, so 125's too) are bit for bit equal.
    replayed = range(r["good_step"], 126)
    assert [branch[s] for s in replayed] == [original[s] for s in replayed]
    # After the first step with another rate, the runs part.
    assert branch[126] != original[126] and branch[126] < original[126]
    assert all(math.isfinite(v) for v in branch.values())
    assert branch[max(branch)] < 1.5 * min(original.values())
    assert "losses of steps 120..125 equal the original run's bit for bit" in run["out"]


# The replays run in fresh interpreters, as the script did: a test process may hold
# global torch state other tests set (threads, backends), which moves the last bit.
_WEIGHTS = """
import json, sys, importlib.util
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from vlcc_adjoint._examples import tiny_lm as lm
from vlcc_adjoint.torch.dcp import VlccReader

def weights(repo, ref, seed=5):
    model = lm.TinyLM(seed=seed)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=VlccReader(repo, ref=ref))
    return state["model"]
"""

_REPLAY = (
    _WEIGHTS
    + """
script, repo, good, start, stop = sys.argv[1:]
spec = importlib.util.spec_from_file_location("lineage_lm_replay", script)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
lm.deterministic(0)
data = lm.corpus("grammar")
model, opt = ex.build(seed=3)
ex.restore(repo, good, model, opt)
print(json.dumps([lm.train_step(model, opt, *lm.batch(data, s), ex.schedule(s, 3e-3, 125, 30.0))
                  for s in range(int(start), int(stop))]))
"""
)

_FINETUNE = (
    _WEIGHTS
    + """
repo, ref, first, saved_ref = sys.argv[1:]
lm.deterministic(0)
addition = lm.corpus("addition", 100_000)
model = lm.TinyLM(seed=7)
model.load_state_dict(weights(repo, ref))
opt = torch.optim.AdamW(model.parameters(), weight_decay=0.0)
losses = [lm.train_step(model, opt, *lm.batch(addition, s), 1e-3) for s in range(int(first))]
saved = weights(repo, saved_ref)
tuned = model.state_dict()
print(json.dumps({"losses": losses, "equal": all(torch.equal(tuned[k], saved[k]) for k in saved)}))
"""
)


def _fresh(code: str, *args) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_replay_from_the_good_version_reproduces_the_recorded_losses(run):
    """Independently of the script: restore the good version (weights *and* AdamW's state)
    through DCP, run the original schedule, compare with the original run's losses."""
    r = run["result"]
    steps = range(r["good_step"], r["first_bad"] + 1)
    losses = _fresh(_REPLAY, SCRIPT, run["repo"], r["good"], steps.start, steps.stop)
    assert losses == [r["original_losses"][s] for s in steps]


def test_the_dag_has_the_diverged_main_and_the_two_branches(run):
    r = run["result"]
    with History(run["repo"], mode="r") as h:
        branches, tags = h.branches, h.tags
        assert set(branches) == {"main", "lr-capped", "finetune-addition"}
        assert tags == {"last-good": r["good"], "pretrained": r["pretrained"]}
        main = [v.id for v in h.log("main")]
        capped = [v.id for v in h.log("lr-capped")]
        tune = [v.id for v in h.log("finetune-addition")]
        good_ancestors = [v.id for v in h.log(r["good"])]
        # main: 12 saves up to the good version, then the diverged one
        assert main == [r["main_versions"][s] for s in sorted(r["main_versions"], reverse=True)]
        assert len(main) == len(good_ancestors) + 1 and main[1:] == good_ancestors
        # lr-capped forks at the good version: shares its ancestry, not main's tip
        assert capped[-len(good_ancestors) :] == good_ancestors
        assert capped[: -len(good_ancestors)] == [
            r["branch_versions"][s] for s in sorted(r["branch_versions"], reverse=True)
        ]
        assert main[0] not in capped and h.version(capped[-len(good_ancestors) - 1]).parents == (
            r["good"],
        )
        # the fine-tune forks at the tag 'pretrained', the tip of lr-capped
        assert r["pretrained"] == branches["lr-capped"] == capped[0]
        assert tune[len(r["finetune_versions"]) :] == capped
        assert h.version(tune[len(r["finetune_versions"]) - 1]).parents == (r["pretrained"],)
        assert len(h.log(all=True)) == len(main) + len(r["branch_versions"]) + len(
            r["finetune_versions"]
        )
    out = run["out"]
    assert "$ vlcc log" in out and "$ vlcc diff" in out
    assert "(HEAD -> main)" in out or "(main)" in out
    assert "|/" in out  # the fork, drawn
    for name in ("lr-capped", "finetune-addition", "tag: pretrained", "tag: last-good"):
        assert name in out, name


def test_the_finetune_starts_from_the_tagged_versions_weights(run):
    """Replay the first fine-tuning segment from the tag's weights: it reproduces the branch's
    first version bit for bit; from the good version's weights it does not."""
    r = run["result"]
    first = min(r["finetune_versions"])
    saved = r["finetune_versions"][first]
    tagged = _weights(run["repo"], "pretrained")
    assert all(torch.equal(tagged[k], _weights(run["repo"], r["pretrained"])[k]) for k in tagged)
    from_tag = _fresh(_FINETUNE, run["repo"], "pretrained", first, saved)
    assert from_tag["equal"]
    assert from_tag["losses"] == [r["finetune_losses"][s] for s in range(first)]
    from_good = _fresh(_FINETUNE, run["repo"], "last-good", first, saved)
    assert not from_good["equal"]
    # and it learned the second task
    assert r["eval_after"]["addition"] < 0.5 * r["eval_before"]["addition"]
