"""What the C and Fortran interface's tests share: paths, running a program clean, the schedules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"
EXAMPLES = ROOT / "examples"

#: The environment programs run with: nothing of Python's.
CLEAN_ENV = {"PATH": os.defpath, "LC_ALL": "C"}


def run_program(
    exe: Path, *args: str, cwd: Path, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `exe` in `cwd` with :data:`CLEAN_ENV`; with `check`, fail the test
    (showing its output) unless it exits 0."""
    proc = subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{exe.name} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


#: ``(config, steps)`` of the answers test: every schedule kind, several
#: levels and tiers, both ways of reaching TURN (Online's sweep reaches u_n;
#: the others' end at u_{n-1}), and the smallest schedules.
SCHEDULES = {
    "revolve": ({"schedule": {"kind": "revolve", "steps": 40, "snapshots": 4}}, 40),
    "revolve-one-step": ({"schedule": {"kind": "revolve", "steps": 1, "snapshots": 1}}, 1),
    "storeall": ({"schedule": {"kind": "storeall", "steps": 12}}, 12),
    "periodic": ({"schedule": {"kind": "periodic", "steps": 20, "every": 5}}, 20),
    "online": ({"schedule": {"kind": "online", "steps": 25, "snapshots": 4}}, 25),
    "multistage-zarr": (
        {
            "schedule": {
                "kind": "multistage",
                "steps": 30,
                "levels": [{"slots": 2}, {"slots": 6, "write_cost": 2, "read_cost": 2}],
            },
            "store": {
                "tiers": [{"kind": "memory"}, {"kind": "zarr", "path": "ck.zarr", "mode": "w"}],
                "prefetch_bytes": 4096,
            },
        },
        30,
    ),
    "multistage-compressed": (
        {
            "schedule": {
                "kind": "multistage",
                "steps": 30,
                "levels": [[2, 0, 0], [8, 1, 1]],
            },
            "store": {
                "tiers": [
                    {"kind": "memory", "capacity_bytes": 1 << 20},
                    {
                        "kind": "compressed",
                        "codec": {"name": "vlcc_lossless", "configuration": {"clevel": 3}},
                    },
                ],
                "reserve": 2,
            },
        },
        30,
    ),
}
