"""Independent referee: run Firedrake ``checkpoint_schedules`` (1.0.4)
schedules and report their statistics in OUR convention.

Our convention
--------------
States u_0..u_n; forward step i maps u_i -> u_{i+1}; adjoint step i needs
u_i (and recomputes forward step i itself). A schedule starts holding u_0 and
performs adjoint steps n-1..0. "forward" counts forward-step evaluations
OUTSIDE adjoint steps. Levels: 0 = RAM, 1 = disk.

How their conventions map to ours (verified by ``_drive``'s assertions and
numerically on grids, n <= 200)
------------------------------------------------------------------------
* ``max_n`` = our n. Their "step k" is our forward step k; "start of step k"
  is our u_k. ``Forward(n0, n1, ...)`` evaluates forward steps n0..n1-1
  (u_{n0} -> u_{n1}); ``Reverse(k+1, k)`` is our adjoint step k.
* ``Forward(n0, n1, write_ics=True, storage=S)`` stores u_{n0} (the state the
  advance STARTS from) at level S: one write at that level, plus n1-n0
  forward steps.
* ``Forward(k, k+1, write_adj_deps=True, storage=WORK)`` directly followed
  (possibly with an ``EndForward`` in between) by ``Reverse(k+1, k)`` is the
  taped forward of adjoint step k, i.e. adjoint step k's own recomputation in
  our convention: NOT counted.  Their initial sweep runs the primal to u_{n-1}
  then does ``Forward(n-1, n, write_adj_deps)``, ``EndForward``,
  ``Reverse(n, n-1)``: u_n is only computed inside adjoint step n-1, as in
  ours, so there is no offset.  Every other Forward step is counted.
  Multi-step taped forwards / reverses never occur and are rejected.
* ``Copy(k, S, WORK)`` / ``Move(k, S, WORK)``: one read of u_k from level S
  (Move also frees the slot). ``Move(k, S, NONE)`` is a free delete.  A Copy /
  Move between RAM and DISK would count a read at the source and a write at
  the destination (not produced by these schedules).
* Snapshot counts INCLUDE u_0: every schedule starts with
  ``Forward(0, j, write_ics=True, S)``, i.e. u_0 is written to a slot (and
  costs one write at level S).  So their ``snapshots_in_ram = c`` is our c
  (u_0 occupying one slot): Revolve(n, c) forward == t(n, c) exactly, and
  ``peak`` (max simultaneous snapshots) never exceeds the slot counts.
  'writes' INCLUDES this initial write of u_0 (``u0_level`` says where it
  went); subtract it if your schedule treats u_0 as held for free.
* Their internal cost models: HRevolve optimises with RAM write/read cost 0
  (it passes ``wc=[0, wd]``, ``rc=[0, rd]``); our w_ram/r_ram only enter the
  reported 'time'.  Their makespan (``Sequence.makespan`` of the raw
  hrevolve/disk_revolve sequence) == our 'time' + n*(fwd_cost + bwd_cost)
  (taped forward + backward per adjoint step), except that raw HRevolve
  sequences may hold a useless disk write ``W^1_k`` directly followed by
  ``W^0_k``; the cs translation keeps only the RAM write, so 'time' is then
  w_disk lower per such write (seen only without ``fix_uf_ub_swap``).
* BUG in 1.0.4 HRevolve: uf/ub are passed swapped to ``get_hopt_table``, so
  HRevolve is suboptimal when fwd_cost != bwd_cost (e.g. n=200, RAM only,
  c=7, uf=3, ub=1: 856 forward steps vs t(200,7)=635; n=200, 3 RAM + 4 disk,
  wd=rd=10: time 3023 (makespan 3823) vs 2200 fixed, 2645 for Multistage).
  ``cs_hrevolve(..., fix_uf_ub_swap=True)`` undoes it.
  ``HRevolve(1, ...)`` raises IndexError; ``cs_hrevolve`` returns the trivial
  result for n == 1.
* ``DiskRevolve`` passes (wd, rd) into ``disk_revolve(l, cm, rd, wd, ...)``
  swapped, but with one read per disk snapshot only wd+rd enters its DP.
  ``Revolve``'s uf/ub/wd/rd are irrelevant to its (unit-cost) DP.
* Cost: schedules are generated in ``__init__`` by pure-python dynamic
  programming (Revolve ~0.13 s at n=200, c=10; 3 s at n=1000, c=10).
  Multistage's ``n_advance`` is numba-jitted: the FIRST call in a process
  costs ~3 s of compilation, later calls are ~ms.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from contextlib import contextmanager
from math import comb
from typing import Any

import checkpoint_schedules as cs
from checkpoint_schedules import Copy, EndForward, EndReverse, Forward, Move, Reverse, StorageType

_LEVEL = {StorageType.RAM: 0, StorageType.DISK: 1}


def griewank_t(n: int, c: int) -> int:
    """Griewank's optimal forward count t(n, c) = r*n - C(c+r, c+1), with r
    least such that C(c+r, c) >= n (c slots, u_0 in one of them)."""
    r = 0
    while comb(c + r, c) < n:
        r += 1
    return r * n - comb(c + r, c + 1)


def _peak(spans: list) -> dict[int, int]:
    """Max number of simultaneously live snapshots per level, given
    (level, first_action_index, last_action_index) spans (inclusive)."""
    peak = {0: 0, 1: 0}
    for lv in (0, 1):
        ev = sorted(
            [(s, 1) for v, s, e in spans if v == lv] + [(e + 1, -1) for v, s, e in spans if v == lv]
        )
        cur = 0
        for _, d in ev:
            cur += d
            peak[lv] = max(peak[lv], cur)
    return peak


def _drive(schedule: Iterable, n: int) -> dict[str, Any]:
    """Run a checkpoint_schedules schedule to EndReverse, simulating the
    storage, asserting consistency, and counting in OUR convention.

    Returns {'forward', 'writes', 'reads', 'peak', 'u0_level'}; writes / reads
    / peak are {level: int} with 0 = RAM, 1 = disk.  'peak' is the max number
    of simultaneously LIVE snapshots (live from its write to its last read:
    the Revolve-family translation drops the Discard operations, so e.g. a
    disk snapshot copied to RAM is never freed explicitly)."""
    writes = {0: 0, 1: 0}
    reads = {0: 0, 1: 0}
    live: dict[tuple, list] = {}  # (level, k) -> [level, start, last_use]
    spans: list = []
    forward = 0
    pos = 0  # index of the state currently in WORK
    taped = None  # step k whose adj deps sit in WORK
    next_adj = n - 1  # next adjoint step expected
    u0_level = None

    def write(lv: int, k: int, idx: int) -> None:
        writes[lv] += 1
        live[(lv, k)] = [lv, idx, idx]
        spans.append(live[(lv, k)])

    for idx, a in enumerate(schedule):
        if isinstance(a, Forward):
            assert taped is None, f"forward {a} while adj deps pending"
            assert a.n0 == pos, f"{a} does not start at u_{pos}"
            assert a.n1 <= n
            if a.write_ics:
                write(_LEVEL[a.storage], a.n0, idx)
                if a.n0 == 0 and u0_level is None:
                    u0_level = _LEVEL[a.storage]
            if a.write_adj_deps:
                if a.n1 - a.n0 != 1 or a.n0 != next_adj:
                    raise NotImplementedError(f"unexpected taped {a}")
                taped = a.n0  # adjoint step's own recomputation
            else:
                forward += a.n1 - a.n0
            pos = a.n1
        elif isinstance(a, Reverse):
            if a.n1 - a.n0 != 1:
                raise NotImplementedError(f"multi-step {a}")
            assert a.n0 == next_adj == taped, f"{a} without its taped forward"
            taped = None
            next_adj -= 1
        elif isinstance(a, (Copy, Move)):
            assert taped is None
            src, dst = a.from_storage, a.to_storage
            if src in _LEVEL:
                key = (_LEVEL[src], a.n)
                assert key in live, f"{a}: not stored"
                if dst is not StorageType.NONE:
                    reads[key[0]] += 1
                    live[key][2] = idx
                if isinstance(a, Move):
                    del live[key]
            if dst in _LEVEL:
                write(_LEVEL[dst], a.n, idx)
            elif dst is StorageType.WORK:
                pos = a.n
        elif isinstance(a, EndForward):
            pass
        elif isinstance(a, EndReverse):
            break
        else:
            raise TypeError(f"unexpected action {a!r}")
    assert next_adj == -1, "not all adjoint steps performed"
    return {
        "forward": forward,
        "writes": writes,
        "reads": reads,
        "peak": _peak(spans),
        "u0_level": u0_level,
    }


def _time(
    res: dict[str, Any], fwd_cost: float, w: dict[int, float], r: dict[int, float]
) -> dict[str, Any]:
    """Add 'time' = forward*fwd_cost + sum writes*w + sum reads*r."""
    res["time"] = (
        res["forward"] * fwd_cost
        + sum(res["writes"][k] * w[k] for k in (0, 1))
        + sum(res["reads"][k] * r[k] for k in (0, 1))
    )
    return res


def cs_revolve(n: int, snapshots: int, fwd_cost: float = 1.0) -> dict[str, Any]:
    """checkpoint_schedules.Revolve with ``snapshots`` RAM slots INCLUDING
    u_0 (== our c; forward == griewank_t(n, snapshots)). RAM I/O is free."""
    res = _drive(cs.Revolve(n, snapshots), n)
    return _time(res, fwd_cost, {0: 0, 1: 0}, {0: 0, 1: 0})


def cs_multistage(
    n: int,
    ram: int,
    disk: int,
    fwd_cost: float = 1.0,
    w_disk: float = 0.0,
    r_disk: float = 0.0,
    w_ram: float = 0.0,
    r_ram: float = 0.0,
    trajectory: str = "maximum",
) -> dict[str, Any]:
    """MultistageCheckpointSchedule(n, ram, disk): binomial (Revolve-optimal
    forward count for c = ram + disk, u_0 included) with the most-used slots
    placed in RAM (Stumm & Walther). Costs only enter 'time'."""
    sch = cs.MultistageCheckpointSchedule(n, ram, disk, trajectory=trajectory)
    return _time(_drive(sch, n), fwd_cost, {0: w_ram, 1: w_disk}, {0: r_ram, 1: r_disk})


@contextmanager
def _hopt_uf_ub_fixed():
    """Temporarily undo the 1.0.4 bug: hrevolve_sequences.hrevolve calls
    ``get_hopt_table(l, c, w, r, uf, ub)`` but the signature is
    ``(lmax, cvect, wvect, rvect, ub, uf)``, so the DP table is built with
    forward/backward costs swapped (suboptimal whenever uf != ub)."""
    mod = sys.modules["checkpoint_schedules.hrevolve_sequences.hrevolve"]
    orig = mod.get_hopt_table
    mod.get_hopt_table = lambda lmax, c, w, r, uf, ub: orig(lmax, c, w, r, ub=ub, uf=uf)
    try:
        yield
    finally:
        mod.get_hopt_table = orig


def cs_hrevolve(
    n: int,
    ram: int,
    disk: int,
    fwd_cost: float,
    bwd_cost: float,
    w_disk: float,
    r_disk: float,
    w_ram: float = 0.0,
    r_ram: float = 0.0,
    fix_uf_ub_swap: bool = False,
) -> dict[str, Any]:
    """HRevolve(n, ram, disk, uf, ub, wd, rd): two-level schedule (u_0
    occupies one RAM or disk slot). HRevolve itself assumes RAM I/O is free;
    w_ram / r_ram only enter the reported 'time'.  As shipped (1.0.4) it is
    only optimal for fwd_cost == bwd_cost; ``fix_uf_ub_swap=True`` builds it
    with the swapped-argument bug undone (see ``_hopt_uf_ub_fixed``)."""
    if n == 1:  # HRevolve(1, ...) raises IndexError in 1.0.4 (lmax=0 table)
        res = {
            "forward": 0,
            "writes": {0: 0, 1: 0},
            "reads": {0: 0, 1: 0},
            "peak": {0: 0, 1: 0},
            "u0_level": None,
        }
        return _time(res, fwd_cost, {0: w_ram, 1: w_disk}, {0: r_ram, 1: r_disk})
    if fix_uf_ub_swap:
        with _hopt_uf_ub_fixed():
            sch = cs.HRevolve(n, ram, disk, uf=fwd_cost, ub=bwd_cost, wd=w_disk, rd=r_disk)
    else:
        sch = cs.HRevolve(n, ram, disk, uf=fwd_cost, ub=bwd_cost, wd=w_disk, rd=r_disk)
    return _time(_drive(sch, n), fwd_cost, {0: w_ram, 1: w_disk}, {0: r_ram, 1: r_disk})


def cs_disk_revolve(
    n: int, ram: int, fwd_cost: float, bwd_cost: float, w_disk: float, r_disk: float
) -> dict[str, Any]:
    """DiskRevolve(n, ram, ...): ``ram`` RAM slots (including u_0 when u_0
    is kept in RAM) plus unlimited disk, each disk snapshot read once."""
    sch = cs.DiskRevolve(n, ram, uf=fwd_cost, ub=bwd_cost, wd=w_disk, rd=r_disk)
    return _time(_drive(sch, n), fwd_cost, {0: 0.0, 1: w_disk}, {0: 0.0, 1: r_disk})
