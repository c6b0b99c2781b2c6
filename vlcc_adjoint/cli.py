"""The ``vlcc`` command line: ``vlcc plan``, ``vlcc demo``, and the lineage commands
``vlcc log | show | diff | gc | inspect | verify | export | import``
(:mod:`vlcc_adjoint.lineage`).

Its conventions, shared with the scripts in ``examples/``: :class:`Parser`
reports a bad option in one line and exits with status 2 before any work;
every numeric option has a bounded type, :class:`Integer` or :class:`Number`;
a ``--dir`` option goes through :func:`work_directory` (created and kept, or
a temporary directory removed at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import typing
from collections.abc import Sequence

from .errors import VlccValueError

__all__ = ["Integer", "Number", "Parser", "build_parser", "main", "work_directory"]

#: ``vlcc plan`` builds and replays every action of the table, at least one
#: per step (the Reverse): 10-15 s at this many steps on one core.
PLAN_MAX_STEPS = 300_000_000


# ----------------------------------------------------------------------------
# options: the conventions of vlcc and of the scripts in examples/
# ----------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors take one line.

    ``vlcc`` and the example scripts report a bad option as
    ``PROG: error: MESSAGE (see PROG --help)`` on standard error and exit
    with status 2, before any work, like every other ``vlcc`` error; the
    usage text that argparse prints first is left to ``--help``.  A
    subcommand's parser (``vlcc demo``) reports under the program's name
    (``vlcc: error: ...``) and points at its own help.
    """

    #: the subcommands' parsers, by name (set by :func:`build_parser`)
    commands: dict[str, Parser]

    def error(self, message: str) -> typing.NoReturn:
        root = self.prog.split()[0]
        self.exit(2, f"{root}: error: {message} (see {self.prog} --help)\n")


@dataclasses.dataclass(frozen=True)
class Integer:
    """An argparse ``type=``: an integer within ``[least, most]`` (``None``:
    unbounded on that side), or a one-line error naming the bounds (and
    `why`, if given, in parentheses).

    ``parser.add_argument("--steps", type=Integer(1), default=1000)``.
    """

    least: int | None = None
    most: int | None = None
    why: str = ""

    def expected(self) -> str:
        bounds = [f">= {self.least:,}"] if self.least is not None else []
        bounds += [f"<= {self.most:,}"] if self.most is not None else []
        return " ".join(["an integer", " and ".join(bounds)]).strip() + _reason(self.why)

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.expected()}, got {text!r}") from None
        if (self.least is not None and value < self.least) or (
            self.most is not None and value > self.most
        ):
            raise argparse.ArgumentTypeError(f"must be {self.expected()}, got {value:,}")
        return value


@dataclasses.dataclass(frozen=True)
class Number:
    """An argparse ``type=``: a finite number ``>= least``, ``> above`` and
    ``<= most`` (each ``None``: no such bound), or a one-line error naming
    the bounds (and `why`, if given, in parentheses).

    ``parser.add_argument("--dt", type=Number(above=0.0), default=0.01)``.
    """

    least: float | None = None
    above: float | None = None
    most: float | None = None
    why: str = ""

    def expected(self) -> str:
        bounds = [f">= {self.least:g}"] if self.least is not None else []
        bounds += [f"> {self.above:g}"] if self.above is not None else []
        bounds += [f"<= {self.most:g}"] if self.most is not None else []
        return " ".join(["a finite number", " and ".join(bounds)]).strip() + _reason(self.why)

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.expected()}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or (self.least is not None and value < self.least)
            or (self.above is not None and value <= self.above)
            or (self.most is not None and value > self.most)
        ):
            raise argparse.ArgumentTypeError(f"must be {self.expected()}, got {text}")
        return value


def _reason(why: str) -> str:
    return f" ({why})" if why else ""


def work_directory(
    parser: argparse.ArgumentParser, path: str | None, *names: str
) -> contextlib.AbstractContextManager[str]:
    """The work directory of a ``--dir`` option, as a context manager.

    With `path`, the directory is created if missing and kept: what the
    run writes there stays (an error, through ``parser.error``, if it
    already holds any of `names`, a previous run's results, or cannot be
    created).  Without, a new temporary directory, removed with
    everything in it on exit: a run removes what it creates for itself.
    """
    if path is None:
        return tempfile.TemporaryDirectory(prefix="vlcc-example-")
    taken = [name for name in names if os.path.lexists(os.path.join(path, name))]
    if taken:
        parser.error(
            f"--dir {path} already holds {', '.join(taken)} (a previous run's): give a new "
            "directory, or remove them"
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        parser.error(f"--dir {path}: {error.strerror or error}")
    return contextlib.nullcontext(path)


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
        type=Integer(1),
        default=1000,
        help=f"forward steps n (at most {PLAN_MAX_STEPS:,}: every action is replayed)",
    )
    plan.add_argument(
        "--snapshots",
        type=Integer(1),
        default=20,
        help="slots (u_0 included); multistage: fast-level slots",
    )
    plan.add_argument("--disk", type=Integer(0), default=0, help="multistage: slow-level slots")
    plan.add_argument(
        "--disk-write",
        type=Number(0.0),
        default=10.0,
        help="multistage: cost of one write to the slow level",
    )
    plan.add_argument(
        "--disk-read",
        type=Number(0.0),
        default=10.0,
        help="multistage: cost of one read from the slow level",
    )
    plan.add_argument(
        "--forward-cost", type=Number(0.0), default=1.0, help="multistage: cost of a forward step"
    )
    plan.add_argument(
        "--adjoint-cost", type=Number(0.0), default=1.0, help="multistage: cost of an adjoint step"
    )
    plan.add_argument("--every", type=Integer(1), default=10, help="periodic: checkpoint period")
    plan.add_argument("--plot", metavar="PNG", help="draw the schedule into this file")


def _make_schedule(args):
    from . import schedules as s

    if args.schedule == "revolve":
        return s.Revolve(args.steps, args.snapshots)
    if args.schedule == "multistage":
        from .budget import SolveProgress

        levels = [s.Level(args.snapshots)]
        if args.disk:
            levels.append(s.Level(args.disk, args.disk_write, args.disk_read))
        # A long solve says so after a few seconds, and shows its progress on
        # standard error (stdout keeps the statistics alone).
        reporter = SolveProgress(
            f"vlcc plan: solving Multistage({args.steps:,} steps, slots "
            f"{[level.slots for level in levels]})",
            "give fewer --disk slots or fewer --steps, or use vlcc plan revolve "
            "(one level, planned at once)",
        )
        try:
            return s.Multistage(
                args.steps, levels, args.forward_cost, args.adjoint_cost, progress=reporter
            )
        finally:
            reporter.close()
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


def _grid_side(text: str) -> int:
    """``vlcc demo --nx / --nz``: at least the demo's smallest grid side."""
    from ._examples.demo import MIN_GRID

    return Integer(MIN_GRID, why="the absorbing layer takes 8 cells on each side")(text)


def _demo(args) -> int:
    from ._examples.demo import check_demo_budget, vlcc_demo

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

    return add_commands(sub, Integer, Number)


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


def build_parser() -> tuple[Parser, dict]:
    """The ``vlcc`` parser, its subcommands' parsers in ``parser.commands``
    (``{name: Parser}``), and ``{lineage command: function(args) -> exit
    status}``."""
    parser = Parser(prog="vlcc", description=__doc__)
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
    demo.add_argument("--nx", type=_grid_side, default=300, help="grid points in x")
    demo.add_argument("--nz", type=_grid_side, default=300, help="grid points in z")
    demo.add_argument("--steps", type=Integer(1), default=2000, help="time steps")
    demo.add_argument(
        "--memory-states", type=Integer(0), default=10, help="memory budget, in states"
    )
    demo.add_argument("--disk-states", type=Integer(0), default=41, help="disk budget, in states")
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
    parser.commands = dict(sub.choices)
    return parser, lineage


def main(argv: Sequence[str] | None = None) -> int:
    parser, lineage = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(rest)
    if rest:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(rest)}")
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
