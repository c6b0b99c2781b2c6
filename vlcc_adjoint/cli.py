"""The ``vlcc`` command line: ``vlcc plan``, ``vlcc demo``, and the lineage commands
``vlcc log | show | diff | gc | inspect | export | import`` (:mod:`vlcc_adjoint.lineage`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import VlccValueError

#: ``vlcc plan`` builds and replays every action of the table, at least one
#: per step (the Reverse): 10-15 s at this many steps on one core.
PLAN_MAX_STEPS = 300_000_000


def _add_plan(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="print (and plot) a checkpoint schedule's statistics",
        description="Plan a checkpoint schedule and print what it costs.",
    )
    plan.add_argument(
        "schedule",
        nargs="?",
        default="revolve",
        choices=["revolve", "multistage", "online", "periodic", "storeall"],
    )
    plan.add_argument(
        "--steps",
        type=int,
        default=1000,
        help=f"forward steps n (at most {PLAN_MAX_STEPS:,}: every action is replayed)",
    )
    plan.add_argument(
        "--snapshots",
        type=int,
        default=20,
        help="slots (u_0 included); multistage: fast-level slots",
    )
    plan.add_argument("--disk", type=int, default=0, help="multistage: slow-level slots")
    plan.add_argument(
        "--disk-write",
        type=float,
        default=10.0,
        help="multistage: cost of one write to the slow level",
    )
    plan.add_argument(
        "--disk-read",
        type=float,
        default=10.0,
        help="multistage: cost of one read from the slow level",
    )
    plan.add_argument("--forward-cost", type=float, default=1.0)
    plan.add_argument("--adjoint-cost", type=float, default=1.0)
    plan.add_argument("--every", type=int, default=10, help="periodic: checkpoint period")
    plan.add_argument("--plot", metavar="PNG", help="draw the schedule into this file")


def _make_schedule(args):
    from . import schedules as s

    if args.schedule == "revolve":
        return s.Revolve(args.steps, args.snapshots)
    if args.schedule == "multistage":
        levels = [s.Level(args.snapshots)]
        if args.disk:
            levels.append(s.Level(args.disk, args.disk_write, args.disk_read))
        return s.Multistage(args.steps, levels, args.forward_cost, args.adjoint_cost)
    if args.schedule == "online":
        return s.Online(args.steps, snapshots=args.snapshots)
    if args.schedule == "periodic":
        return s.Periodic(args.steps, args.every)
    return s.StoreAll(args.steps)


def _plan(args) -> int:
    from .schedules import binomial_forward_count

    if args.plot:
        from .plot import check_figure_path

        check_figure_path(args.plot, "--plot")
    if args.steps > PLAN_MAX_STEPS:
        raise VlccValueError(
            f"--steps {args.steps:,} is more than vlcc plan replays (it checks every action, "
            f"at least one per step); give --steps {PLAN_MAX_STEPS:,} or fewer, or build the "
            "schedule in Python and consume Schedule.blocks()"
        )
    schedule = _make_schedule(args)
    stats = schedule.stats()
    print(schedule)
    width = len("recompute_ratio")
    for name in stats.__dataclass_fields__:
        print(f"  {name:<{width}}  {getattr(stats, name)}")
    print(f"  {'recompute_ratio':<{width}}  {stats.recompute_ratio:.3f}")
    if args.schedule in ("revolve", "online"):
        best = binomial_forward_count(args.steps, args.snapshots)
        print(f"  offline optimum t(n, c) = {best} forward steps")
    if args.plot:
        from .plot import plot_schedule

        plot_schedule(schedule, args.plot)
        print(f"  plot written to {args.plot}")
    return 0


def _demo(args) -> int:
    from ._examples.demo import MIN_GRID, check_demo_budget, vlcc_demo

    for flag, value, least in (
        ("--nx", args.nx, MIN_GRID),
        ("--nz", args.nz, MIN_GRID),
        ("--steps", args.steps, 1),
    ):
        if value < least:
            hint = " (the absorbing layer takes 8 cells on each side)" if flag != "--steps" else ""
            raise VlccValueError(f"{flag} must be >= {least}{hint}, got {value}")
    check_demo_budget(args.nx, args.nz, args.memory_states, args.disk_states)
    if args.png:
        from .plot import check_figure_path

        check_figure_path(args.png, "--png")
    result = vlcc_demo(
        nx=args.nx,
        nz=args.nz,
        nt=args.steps,
        memory_states=args.memory_states,
        disk_states=args.disk_states,
        png=args.png or None,
    )
    return 0 if result["passed"] else 1


def _add_lineage(sub) -> dict:
    """The lineage subcommands (``vlcc log PATH`` ...); see ``vlcc_adjoint._lineage._cli``."""
    from ._lineage._cli import add_commands

    return add_commands(sub)


def _bench(rest) -> int:
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py"
    if not script.exists():
        print(
            "vlcc: error: vlcc bench runs the benchmarks of a source checkout; clone the "
            "repository and install it with pip install -e '.[test,bench]'",
            file=sys.stderr,
        )
        return 2
    # benchmarks/run_all.py is a script of the source tree, not a module of
    # the package: load it from its path and run it here, under this name.
    spec = importlib.util.spec_from_file_location("vlcc_bench_run_all", script)
    if spec is None or spec.loader is None:
        print(f"vlcc: error: {script} cannot be loaded as a Python module", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(rest), prog="vlcc bench")


def _version() -> str:
    from . import __version__

    return f"vlcc {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlcc", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    demo = sub.add_parser(
        "demo",
        help="the main example: a seismic gradient within a memory budget",
        description="Compute a full-waveform-inversion gradient of a 2-D acoustic wave "
        "equation with a checkpoint schedule chosen for a memory + disk budget (a temporary "
        "zarr store), check it, and draw it.",
    )
    demo.add_argument("--nx", type=int, default=300, help="grid points in x")
    demo.add_argument("--nz", type=int, default=300, help="grid points in z")
    demo.add_argument("--steps", type=int, default=2000, help="time steps")
    demo.add_argument("--memory-states", type=int, default=10, help="memory budget, in states")
    demo.add_argument("--disk-states", type=int, default=41, help="disk budget, in states")
    demo.add_argument(
        "--png",
        default="vlcc_demo_gradient.png",
        help="where to draw the gradient ('' for no figure)",
    )
    sub.add_parser(
        "bench",
        add_help=False,
        help="run every benchmark (benchmarks/run_all.py; --quick, --full, --only)",
    )
    lineage = _add_lineage(sub)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command in lineage:
        return lineage[args.command](args)
    try:
        if args.command == "plan":
            return _plan(args)
        return _demo(args)
    except (ValueError, OSError, ImportError) as error:
        print(f"vlcc: error: {error}", file=sys.stderr)
        return 2
    except MemoryError as error:
        what = (
            "fewer steps or more snapshots"
            if args.command == "plan"
            else "a smaller grid (--nx, --nz) or fewer --steps"
        )
        print(
            f"vlcc: error: out of memory ({error or 'allocation failed'}); give {what}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("vlcc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
