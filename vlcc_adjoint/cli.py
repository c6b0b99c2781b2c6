"""The ``vlcc`` command line."""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="vlcc")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print a Revolve schedule's statistics")
    plan.add_argument("--steps", type=int, default=1000)
    plan.add_argument("--snapshots", type=int, default=20)
    sub.add_parser("demo", help="the main example (currently: plan a schedule)")
    args = parser.parse_args(argv)
    from .schedules import Revolve, binomial_forward_count

    steps = getattr(args, "steps", 1000)
    snaps = getattr(args, "snapshots", 20)
    schedule = Revolve(steps, snaps)
    stats = schedule.stats()
    print(schedule)
    print(stats)
    print(f"binomial optimum t(n, c) = {binomial_forward_count(steps, snaps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
