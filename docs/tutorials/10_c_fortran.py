"""C and Fortran: a solver's own memory, checkpointed and versioned.

A C or Fortran solver uses the schedules, the tiered store and the lineage
through `vlcc.h` and the Fortran module `vlcc`
([reference](../api/capi.md)).  It *protects* its arrays (their names are
the keys Python sees) and asks "what next?", as with revolve's reverse
communication: each `vlcc_run_next` performs the saves, loads, moves and
deletes the schedule asks for, on the protected memory, and answers what the
solver must compute:

| answer | the regions hold | the solver |
|---|---|---|
| `VLCC_ADVANCE(from, to)` | `u_from` | advances them to `u_to` |
| `VLCC_TURN(n, n)` | `u_n` | seeds the adjoint |
| `VLCC_REVERSE(i + 1, i)` | `u_i` | applies the adjoint of step `i` |
| `VLCC_DONE` | | stops |

The two programs below compute the gradient of
`J = |u_N|^2 / 2` for a small reaction-diffusion solver (N = 1000 steps)
under `Revolve(1000, 8)`: eight states in memory instead of a thousand, and
the forward steps recomputed as the schedule says.  Each commits its
gradient to one history (branches `c` and `fortran`); the Fortran program
checks the C program's version out into its own arrays, and Python reads
both with `History`, checking them against a store-all gradient computed
with numpy.

Build with the flags of `python -m vlcc_adjoint.capi` (like `pkg-config`;
the first use compiles `libvlcc` and the Fortran module into a per-user
cache); the programs carry rpaths and run from any directory, without
environment variables:

```sh
cc adjoint.c $(python -m vlcc_adjoint.capi --cflags --libs) -o adjoint_c
gfortran adjoint.f90 $(python -m vlcc_adjoint.capi --fflags) -o adjoint_f
```

The lifetime rule: a protected array must stay where it is from its
`protect` to the `close` of its run or history; the engine reads and writes
it only during that handle's calls (and between calls its background threads
write slower levels from their own copies).  Every call returns 0 or an
error code, with the message in `vlcc_last_error()`.  Larger examples, with a
two-level Multistage schedule over a zarr disk level and a Taylor test:
`examples/c/heat_adjoint.c`, `examples/fortran/heat_adjoint.f90`.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from vlcc_adjoint.lineage import History

HERE = Path(__file__).resolve().parent / "10_c_fortran"
work = Path(tempfile.mkdtemp(prefix="vlcc-c-fortran-"))  # removed at the end
history = work / "history"


def flags(*which: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "vlcc_adjoint.capi", *which],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def run(exe: Path) -> None:
    # what a user's program gets: no PYTHONPATH, no virtual environment
    env = {"PATH": os.defpath, "LC_ALL": "C"}
    proc = subprocess.run(
        [str(exe), str(history)], cwd=work, env=env, capture_output=True, text=True
    )
    print(proc.stdout, end="")
    if proc.returncode != 0:
        raise SystemExit(f"{exe.name} failed:\n{proc.stdout}{proc.stderr}")


# C: compile, link, run
c_flags = flags("--cflags", "--libs")
subprocess.run(
    ["cc", "-O2", str(HERE / "adjoint.c"), *c_flags, "-o", str(work / "adjoint_c")], check=True
)
run(work / "adjoint_c")

# Fortran (gfortran is needed: Debian's package of that name)
if shutil.which("gfortran"):
    f_flags = flags("--fflags")
    subprocess.run(
        ["gfortran", "-O2", str(HERE / "adjoint.f90"), *f_flags, "-o", str(work / "adjoint_f")],
        check=True,
    )
    run(work / "adjoint_f")
else:
    print("gfortran is not installed: the Fortran program was not built")


# Python: the store-all gradient, with numpy
def diffuse(v: np.ndarray) -> np.ndarray:
    padded = np.pad(v, 1)
    return v + 0.25 * (padded[:-2] - 2 * v + padded[2:])


with History(history, mode="r") as h:
    print("\nbranches:", sorted(h.branches))
    from_c = h.load("c")
    u0 = from_c["u0"]
    states = [u0]
    for _ in range(1000):
        u = states[-1]
        states.append(diffuse(u) - 0.01 * u**3)
    lam = states[-1].copy()
    for u in reversed(states[:-1]):
        lam = diffuse(lam) - 3 * 0.01 * u**2 * lam
    for branch in sorted(h.branches):
        state = h.load(branch)
        version = h.version(branch)
        error = np.max(np.abs(state["gradient"] - lam)) / np.max(np.abs(lam))
        print(
            f"{branch}: version {version.id} {version.message!r}: arrays {list(state)}, "
            f"relative difference to numpy's store-all gradient {error:.1e}"
        )
        assert error < 1e-12
shutil.rmtree(work)
