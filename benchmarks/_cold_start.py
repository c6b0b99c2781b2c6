"""Cold first calls of schedule generation, each in a fresh interpreter.

What a user waits for the first time: ``import`` plus the first call, in a
new process.  Each repeat starts a new ``python -c`` (so nothing is imported
or compiled yet) and times, with ``time.perf_counter`` inside it:

* ``import_s``: ``import vlcc_adjoint`` (``import pyrevolve.crevolve``);
* ``first_s``: the first ``Revolve(n, c)`` (pyrevolve: building one
  ``CRevolve(c, n)`` and calling ``revolve()`` up to ``terminate``);
* ``stats_s``, ``io_plan_s`` (ours): the first ``.stats()`` and
  ``io_plan(...)`` on that schedule;
* ``total_s``: the sum of the above, from the import on (the interpreter's
  own start-up is not included: it is the same for every tool);
* ``warm_s``: the median of up to 5 further calls of the same generation
  in the same process (fewer once they add up to 1 s; ours: ``Revolve(n,
  c)`` alone);
* ``numba``: whether numba was imported by the end of the first calls
  (ours; the warm calls may load it: a process that keeps building
  schedules moves to the numba kernels, see ``schedules/_jit.py``).

Tools: ``ours`` (numba's on-disk cache as it is), ``ours, empty numba
cache`` (``NUMBA_CACHE_DIR`` a new empty directory: a fresh install, where a
kernel that runs must compile), ``pyrevolve shipped`` and ``pyrevolve core``
(its per-call output grabber bypassed, as in ``bench_schedules.py``).
Printed and stored as the median, min and max over the repeats.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

OURS = """
import json, statistics, sys, time
t0 = time.perf_counter()
import vlcc_adjoint
t1 = time.perf_counter()
s = vlcc_adjoint.Revolve({n}, {c})
t2 = time.perf_counter()
s.stats()
t3 = time.perf_counter()
vlcc_adjoint.io_plan(s)
t4 = time.perf_counter()
numba = "numba" in sys.modules
warm = []
while len(warm) < {warm} and sum(warm) < 1.0:
    w = time.perf_counter()
    vlcc_adjoint.Revolve({n}, {c})
    warm.append(time.perf_counter() - w)
print(json.dumps(dict(import_s=t1 - t0, first_s=t2 - t1, stats_s=t3 - t2, io_plan_s=t4 - t3,
                      total_s=t4 - t0, warm_s=statistics.median(warm) if warm else None,
                      numba=numba)))
"""

PYREVOLVE = """
import contextlib, json, statistics, time
t0 = time.perf_counter()
import pyrevolve.crevolve as cr
t1 = time.perf_counter()
if {bypass}:
    cr.OutputGrabber = contextlib.nullcontext

def run():
    step = cr.CRevolve({c}, {n}, None).revolve
    while step() is not cr.Action.terminate:
        pass

run()
t2 = time.perf_counter()
warm = []
while len(warm) < {warm} and sum(warm) < 1.0:
    w = time.perf_counter()
    run()
    warm.append(time.perf_counter() - w)
print(json.dumps(dict(import_s=t1 - t0, first_s=t2 - t1, total_s=t2 - t0,
                      warm_s=statistics.median(warm) if warm else None)))
"""

TOOLS = ("ours", "ours, empty numba cache", "pyrevolve shipped", "pyrevolve core")
FIELDS = ("import_s", "first_s", "stats_s", "io_plan_s", "total_s", "warm_s")


def _have_pyrevolve() -> bool:
    done = subprocess.run([sys.executable, "-c", "import pyrevolve.crevolve"], capture_output=True)
    return done.returncode == 0


def _once(tool: str, n: int, c: int, warm: int, root: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cache = None
    if tool.startswith("ours"):
        code = OURS.format(n=n, c=c, warm=warm)
        if "empty" in tool:
            cache = tempfile.mkdtemp(prefix="cold_numba_cache_")
            env["NUMBA_CACHE_DIR"] = cache
    else:
        code = PYREVOLVE.format(n=n, c=c, warm=warm, bypass=tool == "pyrevolve core")
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"rc={done.returncode}"
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    sizes, c=10, repeats=5, warm=5, tools=TOOLS, root=None, timeout=120.0, say=print
) -> list[dict]:
    """One row per (tool, n): each field's median/min/max over `repeats` fresh processes."""
    root = os.path.abspath(root or os.path.join(os.path.dirname(__file__), os.pardir))
    if not _have_pyrevolve():
        tools = [t for t in tools if not t.startswith("pyrevolve")]
    rows = []
    for n in sizes:
        for tool in tools:
            runs = [_once(tool, n, c, warm, root, timeout) for _ in range(repeats)]
            ok = [r for r in runs if "error" not in r]
            row = dict(
                tool=tool,
                n=n,
                c=c,
                repeats=len(ok),
                root=root,
                errors=[r["error"] for r in runs if "error" in r],
            )
            for field in FIELDS:
                values = [r[field] for r in ok if r.get(field) is not None]
                if values:
                    row[field] = dict(
                        median=statistics.median(values),
                        min=min(values),
                        max=max(values),
                        all=values,
                    )
            if ok and "numba" in ok[0]:
                row["numba_imported"] = sorted({r["numba"] for r in ok})
            rows.append(row)
            say(format_row(row))
    return rows


def _ms(row, field):
    cell = row.get(field)
    if not cell:
        return "-"
    return f"{cell['median'] * 1e3:.3g} [{cell['min'] * 1e3:.3g}, {cell['max'] * 1e3:.3g}]"


HEADER = (
    f"{'tool':<24} {'n':>7}  {'import ms':>20} {'first call ms':>22} "
    f"{'stats ms':>18} {'io_plan ms':>18} {'total ms':>22} {'warm ms':>10}  numba"
)


def format_row(row) -> str:
    warm = row.get("warm_s")
    warm_ms = f"{warm['median'] * 1e3:.3g}" if warm else "-"
    numba = ",".join(str(v) for v in row.get("numba_imported", [])) or "-"
    text = (
        f"{row['tool']:<24} {row['n']:>7}  {_ms(row, 'import_s'):>20} "
        f"{_ms(row, 'first_s'):>22} {_ms(row, 'stats_s'):>18} {_ms(row, 'io_plan_s'):>18} "
        f"{_ms(row, 'total_s'):>22} "
        f"{warm_ms:>10}  {numba}"
    )
    if row["errors"]:
        text += f"  errors: {row['errors'][:2]}"
    return text
