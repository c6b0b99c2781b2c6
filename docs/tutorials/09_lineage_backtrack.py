"""Lineage: backtrack, replay, branch, migrate, compare

A simulation commits its state to a `History` every 20 steps, with its step
and a health measure in the metadata.  Its time step is too large (the
leapfrog scheme's Courant number exceeds 1 in part of the domain), and at
some point the solution blows up.  With the history:

1. **backtrack**: find the newest version that was still healthy, from the
   versions' metadata, without rerunning anything;
2. **replay**: restore the version before it and re-run the window with a
   diagnostic on every step, checking that the replay is faithful (bitwise
   equal to what the run stored);
3. **branch**: go on from the healthy version with a smaller time step, on a
   branch of its own;
4. **migrate**: suspend the run, move the repository as one archive
   (`export_history` / `import_history`, or `vlcc export` / `vlcc import`),
   and resume it at the new place;
5. **compare**: the resumed run's result against an uninterrupted run of the
   same steps (bitwise), and the two branches against each other (`diff`,
   leaf by leaf; `compare`, with tolerances).
"""

import os
import tempfile

import numpy as np

from vlcc_adjoint.lineage import History, export_history, import_history

N, EVERY, FINAL = 400, 20, 300


def initial_state():
    x = np.linspace(0.0, 1.0, N)
    u = np.exp(-((x - 0.3) ** 2) / 0.002)
    c = np.where(x > 0.6, 1.0, 0.6)  # a faster medium on the right
    return {"u": u, "u_prev": u.copy(), "c": c, "courant": 1.05, "step": 0}


def step(s):
    """Leapfrog for u_tt = c^2 u_xx on a string with fixed ends."""
    u, c = s["u"], s["c"]
    lap = np.zeros_like(u)
    lap[1:-1] = u[2:] - 2.0 * u[1:-1] + u[:-2]
    new = 2.0 * u - s["u_prev"] + (s["courant"] * c) ** 2 * lap
    new[0] = new[-1] = 0.0
    return dict(s, u=new, u_prev=u, step=s["step"] + 1)


def run(h, s, stop, branch=None):
    """Step `s` to `stop` (or until it blows up), committing every EVERY steps."""
    while s["step"] < stop:
        s = step(s)
        peak = float(np.abs(s["u"]).max())
        blew_up = peak > 10.0
        if s["step"] % EVERY == 0 or blew_up:
            h.commit(
                s,
                message=f"step {s['step']}" + (" (blew up)" if blew_up else ""),
                meta={"step": s["step"], "peak": peak},
                branch=branch,
            )
            branch = None  # created by the first commit; now HEAD
        if blew_up:
            print(f"step {s['step']}: max |u| = {peak:.3g}, the run stops")
            break
    return s


with tempfile.TemporaryDirectory() as tmp:
    h = History(os.path.join(tmp, "wave.vlcc"))
    s = initial_state()
    h.commit(s, message="step 0", meta={"step": 0, "peak": 1.0})
    run(h, s, FINAL)

    # 1. Backtrack: the newest version whose peak was still that of the initial pulse.
    healthy = next(v for v in h.log() if v.meta["peak"] <= 1.0)
    print(f"newest healthy version: {healthy.id} at step {healthy.meta['step']}")

    # 2. Replay the window after it, with a diagnostic on every step.
    first_bad = min(
        (v for v in h.log() if v.meta["step"] > healthy.meta["step"]), key=lambda v: v.meta["step"]
    )
    replay = h.load(healthy.id)  # load: HEAD does not move
    peaks = []
    while replay["step"] < first_bad.meta["step"]:
        replay = step(replay)
        peaks.append(float(np.abs(replay["u"]).max()))
    print("max |u| step by step:", " ".join(f"{p:.3g}" for p in peaks))
    same = h.compare(first_bad.id, replay)
    print(
        f"replay of steps {healthy.meta['step']}..{first_bad.meta['step']} bitwise equal to the "
        f"stored version: {same.bitwise}"
    )
    assert same.bitwise

    # 3. Branch from the healthy version with a stable time step.
    s = dict(h.checkout(healthy.id), courant=0.9)  # detached HEAD at the healthy version
    s = run(h, s, 200, branch="stable")
    print(h.draw())
    h.close()  # suspended: every commit is on disk

    # 4. Migrate: one archive, unpacked elsewhere; resume from the branch tip.
    archive = export_history(os.path.join(tmp, "wave.vlcc"), os.path.join(tmp, "wave.tar"))
    moved = History(import_history(archive, os.path.join(tmp, "elsewhere", "wave.vlcc")))
    s = run(moved, moved.checkout("stable"), FINAL)
    print(f"resumed at the new place; {moved.version('stable').message} on branch stable")

    # 5. Compare: against an uninterrupted run of the same steps ...
    ref = dict(moved.load(healthy.id), courant=0.9)
    while ref["step"] < FINAL:
        ref = step(ref)
    check = moved.compare("stable", ref)
    print(f"migrated run vs uninterrupted run: equal {bool(check)}, bitwise {check.bitwise}")
    assert check.bitwise
    # ... and the two branches' first versions after the fork, leaf by leaf.
    after_fork = moved.log("stable")[-len(moved.log(healthy.id)) - 1]
    print(moved.diff("main", after_fork.id).table())
    close = moved.compare("main", after_fork.id, rtol=0.1)
    print(f"equal within 10 %: {bool(close)}; first leaf that differs: {close.first_leaf}")
    moved.close()
