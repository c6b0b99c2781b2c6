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
    python examples/lineage_replay.py --dir replay-run    # keep the history there
"""

from __future__ import annotations

import os

import numpy as np

from vlcc_adjoint.cli import Integer, Parser, work_directory
from vlcc_adjoint.lineage import History

#: The history's name in the work directory.
REPOSITORY = "wave.vlcc"


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


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=Integer(1), default=300, help="steps of the original run")
    parser.add_argument("--every", type=Integer(1), default=20, help="commit every k steps")
    parser.add_argument("--n", type=Integer(3), default=2000, help="grid points of the string")
    parser.add_argument(
        "--from-step", type=Integer(0), default=120, help="replay from this stored step"
    )
    parser.add_argument("--to-step", type=Integer(1), default=160, help="... to this stored step")
    parser.add_argument(
        "--dir",
        help=f"work directory: the history is kept there as {REPOSITORY} (the directory is "
        "created if missing; default: a temporary directory, removed at the end)",
    )
    return parser


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, step_no in (("--from-step", args.from_step), ("--to-step", args.to_step)):
        if step_no % args.every or step_no > args.steps:
            parser.error(
                f"{flag} {step_no} is not a stored step: give a multiple of --every "
                f"{args.every} up to --steps {args.steps}"
            )
    if args.from_step >= args.to_step:
        parser.error(f"--from-step {args.from_step} must come before --to-step {args.to_step}")
    with (
        work_directory(parser, args.dir, REPOSITORY) as work,
        History(os.path.join(work, REPOSITORY)) as h,
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
    if args.dir:
        print(f"the history is kept in {os.path.join(args.dir, REPOSITORY)}")
    return result


if __name__ == "__main__":
    main()
