"""Recipe 2: suspend a run, move it to another place, resume it there.

A run is suspended by closing its :class:`~vlcc_adjoint.lineage.History`
(every commit finishes; the process may exit).  The repository is then moved
like any directory, two ways:

* ``vlcc export PATH run.tar`` / ``vlcc import run.tar NEWPATH``
  (:func:`~vlcc_adjoint.lineage.export_history` / ``import_history``): one
  file, chunks stored once (tar hard links), the history exactly as it was;
* a plain copy (``cp -r``, ``rsync``, ``shutil.copytree``): nothing in the
  repository names an absolute path.  (``cp -r`` turns the hard links into
  copies: the copy reads the same and takes more space; ``rsync -H`` keeps them.)

At the new place the run resumes from the branch tip and finishes with the
state an uninterrupted run reaches, bit for bit.

Run it::

    python examples/lineage_migrate.py          # prints the three final digests
    python examples/lineage_migrate.py --dir migrate-run    # keep the histories there
"""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np

from vlcc_adjoint.cli import Integer, Parser, work_directory
from vlcc_adjoint.lineage import History, export_history, import_history

#: What a run writes in its work directory: the three places the run lives
#: (each holds run.vlcc), and the archive carried from the first to the second.
RESULTS = ("machine-a", "machine-b", "machine-c", "run.tar")


def initial_state(n: int) -> dict:
    rng = np.random.default_rng(7)
    return {"u": rng.random((n, n)), "step": 0}


def step(state: dict) -> dict:
    """A smoothing step with a nonlinear source (deterministic, numpy only)."""
    u = state["u"]
    avg = 0.25 * (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1))
    state["u"] = 0.5 * u + 0.5 * avg + 0.01 * np.sin(3.0 * u)
    state["step"] += 1
    return state


def advance(path, until: int, every: int, n: int) -> dict:
    """Resume the run stored at `path` (or start it) and advance it to step `until`."""
    with History(path) as h:
        state = h.checkout("main") if h.head_version else initial_state(n)
        while state["step"] < until:
            step(state)
            if state["step"] % every == 0:
                h.commit(state, message=f"step {state['step']}", meta={"step": state["step"]})
    return state


def digest(state) -> str:
    return hashlib.sha256(state["u"].tobytes()).hexdigest()[:16]


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=Integer(1), default=200, help="steps of the whole run")
    parser.add_argument("--every", type=Integer(1), default=20, help="commit every k steps")
    parser.add_argument("--n", type=Integer(1), default=48, help="grid points per side")
    parser.add_argument(
        "--dir",
        help=f"work directory: the run's three places and its archive are kept there "
        f"({', '.join(RESULTS)}; the directory is created if missing; default: a temporary "
        "directory, removed at the end)",
    )
    return parser


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    half = (args.steps // 2 // args.every) * args.every
    if half == 0:
        parser.error(
            f"--steps {args.steps} leaves no commit before the move (--every {args.every}): "
            f"give --steps {2 * args.every} or more"
        )
    with work_directory(parser, args.dir, *RESULTS) as tmp:
        here = os.path.join(tmp, "machine-a", "run.vlcc")
        advance(here, half, args.every, args.n)  # ... then the job is suspended

        # Way 1: one archive, carried to the other machine and unpacked there.
        archive = export_history(here, os.path.join(tmp, "run.tar"))
        there = import_history(archive, os.path.join(tmp, "machine-b", "run.vlcc"))
        moved = advance(there, args.steps, args.every, args.n)

        # Way 2: a plain directory copy.
        copied_path = os.path.join(tmp, "machine-c", "run.vlcc")
        shutil.copytree(here, copied_path)
        copied = advance(copied_path, args.steps, args.every, args.n)

        reference = initial_state(args.n)
        while reference["step"] < args.steps:
            step(reference)
        with History(there, mode="r") as h:
            log = [v.meta["step"] for v in h.log()]
    result = {
        "export/import": digest(moved),
        "copy": digest(copied),
        "uninterrupted": digest(reference),
        "steps in the moved history": log[::-1],
        "identical": bool(
            np.array_equal(moved["u"], reference["u"])
            and np.array_equal(copied["u"], reference["u"])
        ),
    }
    for key, value in result.items():
        print(f"{key:>26}: {value}")
    if args.dir:
        print(f"the histories and the archive are kept in {args.dir}")
    return result


if __name__ == "__main__":
    main()
