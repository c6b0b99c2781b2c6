"""Recipe 1: checkpoint-restart of a simulation killed mid-run (``kill -9``).

A 2-D reaction-diffusion (Fisher-KPP) simulation commits its state to a
:class:`~vlcc_adjoint.lineage.History` every ``--every`` steps.  Run it, kill
it with SIGKILL at any moment, run the same command again: it resumes from
the latest *durable* version (a version whose write was interrupted is not
in the history) and ends in a final state bitwise identical to an
uninterrupted run, because the restored state is the committed one bit for
bit and the step function is deterministic.

Try it::

    python examples/lineage_restart.py /tmp/heat.vlcc --steps 2000 --delay 0.002 &
    sleep 2; kill -9 %1
    python examples/lineage_restart.py /tmp/heat.vlcc --steps 2000    # resumes
    vlcc log /tmp/heat.vlcc

``tests/examples/test_lineage_recipes.py`` does exactly that and compares the final
state with an uninterrupted run.
"""

from __future__ import annotations

import time

import numpy as np

from vlcc_adjoint.cli import Integer, Number, Parser
from vlcc_adjoint.lineage import History


def initial_state(n: int) -> dict:
    """A deterministic initial condition: two Gaussian seeds on an n x n grid."""
    x = np.linspace(0.0, 1.0, n, endpoint=False)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    u = np.exp(-((xx - 0.3) ** 2 + (yy - 0.4) ** 2) / 0.002)
    u += 0.5 * np.exp(-((xx - 0.7) ** 2 + (yy - 0.6) ** 2) / 0.004)
    return {"u": u, "step": 0, "t": 0.0}


def step(state: dict, dt: float = 0.1, d: float = 0.2) -> dict:
    """One explicit Euler step of u_t = d * laplacian(u) + u (1 - u) (periodic grid)."""
    u = state["u"]
    lap = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4.0 * u
    state["u"] = u + dt * (d * lap + u * (1.0 - u))
    state["step"] += 1
    state["t"] += dt
    return state


def run(
    path, steps: int, every: int = 10, n: int = 64, delay: float = 0.0, quiet: bool = False
) -> dict:
    """Advance to `steps`, committing every `every` steps; resume if `path` has versions.

    **Returns:** the final state.
    """
    with History(path) as h:
        if h.head_version is not None:
            state = h.checkout("main")
            if not quiet:
                print(f"resumed from step {state['step']} (version {h.head_version})", flush=True)
        else:
            state = initial_state(n)
            h.commit(state, message="initial state", meta={"step": 0})
        while state["step"] < steps:
            step(state)
            if state["step"] % every == 0 or state["step"] == steps:
                h.commit(state, message=f"step {state['step']}", meta={"step": state["step"]})
            if delay:
                time.sleep(delay)
        h.tag(f"final-{steps}", "main", force=True)
    return state


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the History directory (created, or resumed)")
    parser.add_argument("--steps", type=Integer(1), default=500, help="steps of the run")
    parser.add_argument("--every", type=Integer(1), default=10, help="commit every k steps")
    parser.add_argument("--n", type=Integer(3), default=64, help="grid points per side")
    parser.add_argument(
        "--delay",
        type=Number(0.0),
        default=0.0,
        help="sleep per step (seconds), to leave time for a kill -9",
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    state = run(args.path, args.steps, args.every, args.n, args.delay)
    digest = __import__("hashlib").sha256(state["u"].tobytes()).hexdigest()[:16]
    print(f"final step {state['step']}, sha256(u) {digest}", flush=True)
    return state


if __name__ == "__main__":
    main()
