"""Recipe 3: replay a window of steps for debugging, from a stored version.

Something odd happens around step 130 of a long wave simulation.  Rather
than rerun from the start, restore the version stored at step ``k`` (found by
its metadata), step it forward to ``j`` under a debugger or with extra
prints, and check that the replay is faithful: the replayed state at ``j`` is
bitwise equal to the version the original run stored at ``j``
(``History.compare(version, state).bitwise``).  ``checkout`` of a version
detaches HEAD there (as ``git checkout <id>``), so the replay can be committed
on a branch of its own that forks at step ``k`` (``commit(..., branch=
"replay")``), diagnostics in its metadata; ``load`` restores without
touching HEAD at all.

Run it::

    python examples/lineage_replay.py --from-step 120 --to-step 160
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from vlcc_adjoint.lineage import History


def initial_state(n: int) -> dict:
    x = np.linspace(0.0, 1.0, n)
    u = np.exp(-((x - 0.3) ** 2) / 0.001)
    c = 0.5 + 0.4 * (x > 0.6)  # a velocity jump: reflections
    return {"u": u, "u_prev": u.copy(), "c": c, "step": 0}


def step(state: dict, courant: float = 0.9) -> dict:
    """Leapfrog for u_tt = (c u_x)_x-ish on a fixed-end string (deterministic)."""
    u, up, c = state["u"], state["u_prev"], state["c"]
    lap = np.zeros_like(u)
    lap[1:-1] = u[2:] - 2.0 * u[1:-1] + u[:-2]
    new = 2.0 * u - up + (courant * c) ** 2 * lap
    new[0] = new[-1] = 0.0
    state["u_prev"], state["u"] = u, new
    state["step"] += 1
    return state


def version_at(h: History, step_no: int) -> str:
    """The id of the version the run stored at `step_no` (by its metadata)."""
    for v in h.log("main"):
        if v.meta.get("step") == step_no:
            return v.id
    raise KeyError(
        f"no version at step {step_no}; steps stored: "
        f"{sorted(v.meta.get('step') for v in h.log('main'))}"
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--from-step", type=int, default=120)
    parser.add_argument("--to-step", type=int, default=160)
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as tmp,
        History(os.path.join(tmp, "wave.vlcc")) as h,
    ):
        state = initial_state(args.n)
        h.commit(state, message="step 0", meta={"step": 0})
        while state["step"] < args.steps:  # the original run
            step(state)
            if state["step"] % args.every == 0:
                h.commit(state, message=f"step {state['step']}", meta={"step": state["step"]})

        # The replay: restore step k, re-run k..j, watch what happens on the way.
        replay = h.checkout(version_at(h, args.from_step))  # HEAD detached at step k
        peak = []
        while replay["step"] < args.to_step:
            step(replay)
            peak.append(float(np.abs(replay["u"]).max()))  # the diagnostic we wanted
        stored = version_at(h, args.to_step)
        check = h.compare(stored, replay)
        h.commit(
            replay,
            message=f"replay {args.from_step}..{args.to_step}",
            meta={"step": replay["step"], "peak": peak[-1]},
            branch="replay",
        )
        result = {
            "bitwise": check.bitwise,
            "equal": check.equal,
            "replayed steps": args.to_step - args.from_step,
            "max |u| over the window": max(peak),
            "log": h.draw(),
        }
    peak_max = result["max |u| over the window"]
    print(
        f"replayed steps {args.from_step}..{args.to_step}: bitwise equal to the stored "
        f"version: {result['bitwise']}; max |u| in the window {peak_max:.4f}"
    )
    print(result["log"])
    return result


if __name__ == "__main__":
    main()
