"""The example runs behind ``examples/*.py`` and ``vlcc demo``.

Each demo builds a problem, computes its gradient twice - checkpointed with
Revolve through :func:`vlcc_adjoint.execute.run_adjoint`, and with the
store-everything referee - prints what it cost, checks that the two agree,
and draws a figure.  Output goes through `out` (``print`` by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import VlccValueError
from .burgers import BurgersProblem
from .seismic import SeismicProblem
from .taylor import TaylorCheck, taylor_check

__all__ = ["burgers_demo", "check_demo_budget", "seismic_demo", "vlcc_demo"]

#: The smallest grid side ``vlcc demo`` accepts: the sponge takes at least 8
#: cells on each side, and the interior must keep at least one.
MIN_GRID = 17


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.abs(b).max())
    return float(np.abs(a - b).max()) / scale if scale > 0 else float(np.abs(a - b).max())


def _checkpointed(problem, schedule, out, store=None) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    grad = problem.gradient_with(schedule, store=store)
    seconds = time.perf_counter() - t0
    run = problem.last_run
    out(
        f"  {schedule!r}: {run.forward_steps} forward + {schedule.n_steps} adjoint steps "
        f"in {seconds:.2f} s (forward {run.forward_seconds:.2f} s, adjoint "
        f"{run.adjoint_seconds:.2f} s, store {run.stall_seconds:.2f} s)"
    )
    return grad, seconds


def _report_taylor(taylor: TaylorCheck, out: Callable[[str], None]) -> None:
    """Print a Taylor test's remainders and its verdict (one failure a line)."""
    out(
        f"  Taylor test: J(m + h dm) for h = {taylor.h[0]:g} .. {taylor.h[-1]:.3g}, halving "
        "until the second-order remainder reaches the rounding level of J"
    )
    out(f"  first-order remainder rates  {' '.join(f'{r:.2f}' for r in taylor.rates0)}")
    out(f"  second-order remainder rates {' '.join(f'{r:.2f}' for r in taylor.rates1)}")
    if taylor.window is not None:
        first, last = taylor.window
        out(
            f"  over h = {taylor.h[first]:.3g} .. {taylor.h[last]:.3g} (the smallest steps "
            f"where it is measurable): second-order rate {taylor.slope1:.2f} (2 or more for "
            f"a correct gradient), first-order {taylor.slope0:.2f} (expect 1), r1 / h "
            f"{taylor.gap:.2e}"
        )
    else:
        out(f"  {taylor.note}")
    for caveat in taylor.caveats:
        out(f"  note: {caveat}")
    for failure in taylor.failures:
        out(f"  FAILED: {failure}")


def _check_gradient(
    problem,
    snapshots: int,
    reference: bool,
    dm: np.ndarray,
    m: np.ndarray,
    out: Callable[[str], None],
    floor: float = 0.0,
) -> tuple[np.ndarray, dict]:
    """The gradient under Revolve, Multistage over memory + a temporary zarr
    disk tier, and StoreAll; their agreement with each other and with the
    store-everything referee; the Taylor test in the direction `dm` (with the
    absolute rounding level `floor` of ``J``, if known)."""
    import tempfile

    from ..schedules import Level, Multistage, Revolve, StoreAll, io_plan
    from ..storage import MemoryTier, TieredStore, ZarrTier

    n = problem.n_steps
    multistage = Multistage(n, [Level(max(2, snapshots // 2)), Level(snapshots, 8.0, 5.0)])
    agreement: dict[str, float] = {}  # max |diff| / max |g| of each gradient and Revolve's
    result: dict[str, Any] = {"agreement": agreement}
    gradients = {}
    with tempfile.TemporaryDirectory(prefix="vlcc-example-") as disk:
        runs = [
            (Revolve(n, snapshots), None),
            (multistage, TieredStore([MemoryTier(), ZarrTier(disk)], plan=io_plan(multistage))),
            (StoreAll(n), None),
        ]
        for schedule, store in runs:
            grad, seconds = _checkpointed(problem, schedule, out, store)
            gradients[type(schedule).__name__] = grad.copy()
            result[f"{type(schedule).__name__}_seconds"] = seconds
    result["adjoint_seconds"] = problem.last_run.adjoint_seconds
    grad = gradients["Revolve"]
    for name, other in gradients.items():
        if name != "Revolve":
            agreement[name] = _agreement(other, grad)
            out(f"  {name} vs Revolve: max |diff| / max |g| = {agreement[name]:.1e}")
    if reference:
        t0 = time.perf_counter()
        ref = problem.reference_gradient()
        result["reference_seconds"] = time.perf_counter() - t0
        agreement["reference"] = _agreement(grad, ref)
        out(
            f"  reference (store all {n + 1} states in a list): {result['reference_seconds']:.2f}"
            f" s, max |diff| / max |g| = {agreement['reference']:.1e}"
        )
    taylor = taylor_check(problem.objective, m, dm, grad, floor=floor)
    _report_taylor(taylor, out)
    result["taylor_rates_first"] = list(taylor.rates0)
    result["taylor_rates_second"] = list(taylor.rates1)
    result["taylor_failures"] = list(taylor.failures)
    result["gradient_norm"] = float(np.linalg.norm(grad))
    return grad, result


def _misfit_floor(problem: SeismicProblem) -> float:
    """The rounding level of differences of the wave misfit ``J`` at the background.

    ``J = dt/2 sum (u - d)^2`` is a small difference of the traces, whose
    energy ``E = dt/2 sum d^2`` is 1e3 to 1e22 times ``J`` on the demo's grids
    (the direct wave is in both).  Rounding each ``u - d`` to ``eps |u|``
    moves ``J`` by about ``2 eps sqrt(J E)`` (Cauchy-Schwarz); the differences
    of ``J`` the Taylor test takes were measured at 1 to 10 times
    ``eps sqrt(J E)``, so 100 times it leaves a margin of 10 or more (see
    :mod:`~vlcc_adjoint._examples.taylor`).
    """
    energy = 0.5 * problem.dt * float(np.sum(problem.d_obs**2))
    value = max(float(problem.objective(problem.v_background)), 0.0)
    return 100.0 * float(np.finfo(float).eps) * float(np.sqrt(value * energy))


def _smooth_bump(problem: SeismicProblem) -> np.ndarray:
    """A smooth velocity perturbation inside the sponge-free interior."""
    b = problem.nbl
    z, x = np.mgrid[0 : problem.nz, 0 : problem.nx]
    cz, cx = problem.nz * 0.6, problem.nx * 0.5
    dv = np.exp(-(((z - cz) / (problem.nz / 8)) ** 2 + ((x - cx) / (problem.nx / 8)) ** 2))
    dv[:b] = dv[-b:] = 0.0
    dv[:, :b] = dv[:, -b:] = 0.0
    return dv * 0.05 * float(problem.v_background.max())


def seismic_demo(
    nx: int = 200,
    nz: int = 200,
    nt: int = 1000,
    snapshots: int = 30,
    png: str | None = "seismic_gradient.png",
    reference: bool = True,
    out: Callable[[str], None] = print,
) -> dict:
    """FWI gradient of a 2-D acoustic problem under three schedules, checked.

    The gradient is computed with Revolve (`snapshots` slots in memory),
    with Multistage over memory (half the slots) and a temporary zarr disk
    tier, and with StoreAll; the three must agree to rounding (they run the
    same arithmetic), and with the store-everything referee when `reference`
    is true.  A Taylor test checks the gradient itself.

    **Returns:** a dict with the objective, the gradient norm, the timings,
    the forward/adjoint speeds in Mpoints/s, the agreements (max abs
    difference / max abs value) and the Taylor remainder rates.
    """
    problem = SeismicProblem(nx=nx, nz=nz, nt=nt)
    out(repr(problem))
    points = nx * nz * nt
    _ = problem.d_obs  # the observed data: one forward sweep in the true model
    t0 = time.perf_counter()
    value = problem.objective()
    t_forward = time.perf_counter() - t0
    out(
        f"  J(v_background) = {value:.6e}   forward sweep {t_forward:.2f} s "
        f"({points / t_forward / 1e6:.0f} Mpoints/s)"
    )
    grad, result = _check_gradient(
        problem,
        snapshots,
        reference,
        _smooth_bump(problem),
        problem.v_background,
        out,
        floor=_misfit_floor(problem),
    )
    result.update(
        objective=value,
        forward_seconds=t_forward,
        forward_mpoints_s=points / t_forward / 1e6,
        adjoint_mpoints_s=points / result["adjoint_seconds"] / 1e6,
    )
    out(f"  adjoint steps {result['adjoint_mpoints_s']:.0f} Mpoints/s")
    out(f"  |dJ/dv| = {result['gradient_norm']:.6e}")
    if png:
        _plot_seismic(problem, grad, png)
        out(f"  gradient image written to {png}")
        result["png"] = png
    return result


def _plot_seismic(problem: SeismicProblem, grad: np.ndarray, path: str) -> None:
    """The true velocity and the gradient, on the physical domain.

    The absorbing layer (``nbl`` cells a side) is cropped: its sensitivities
    are not part of the model.  Distances are in km from the corner of the
    physical domain; the colour scale of the gradient is set below the
    source/receiver depth, whose near field dominates any raw FWI gradient.
    ``J`` is in ``s u^2`` (``u``: the wavefield, in the source's units), so
    ``dJ/dv`` is in ``s^2 u^2 / m`` per grid cell.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = problem.nbl
    km = problem.dx / 1e3
    inner = (slice(b, problem.nz - b), slice(b, problem.nx - b))
    width, depth = (problem.nx - 2 * b) * km, (problem.nz - 2 * b) * km
    # Cell-centred pixels, so that x and z run from 0 at the domain's edge.
    extent = (0.0, width, depth, 0.0)
    image = grad[inner]
    below = image[min(image.shape[0] - 1, problem.src_z - b + 10) :]
    clip = float(np.percentile(np.abs(below), 99.5)) or float(np.abs(image).max()) or 1.0
    exponent = int(np.floor(np.log10(clip)))
    scale = 10.0**exponent
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    im = axes[0].imshow(problem.v_true[inner] / 1e3, extent=extent, cmap="viridis")
    axes[0].set_title("true velocity")
    fig.colorbar(im, ax=axes[0], shrink=0.85, label="v (km/s)")
    im = axes[1].imshow(
        image / scale, extent=extent, cmap="seismic", vmin=-clip / scale, vmax=clip / scale
    )
    axes[1].set_title("gradient dJ/dv at the background model")
    fig.colorbar(
        im, ax=axes[1], shrink=0.85, label=rf"dJ/dv ($10^{{{exponent}}}$ s$^2$ u$^2$ / m per cell)"
    )
    rec_x = (np.asarray(problem.rec_x) - b + 0.5) * km
    rec_z = (np.asarray(problem.rec_z) - b + 0.5) * km
    for ax in axes:
        ax.plot(rec_x, rec_z, ",k", label="receivers")
        ax.plot(
            (problem.src_x - b + 0.5) * km,
            (problem.src_z - b + 0.5) * km,
            "r*",
            ms=10,
            label="source",
        )
        ax.set_xlim(0.0, width)
        ax.set_ylim(depth, 0.0)
        ax.set_xlabel("x (km)")
        ax.set_ylabel("depth z (km)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"2-D acoustic FWI gradient: {width:.2f} x {depth:.2f} km, "
        f"{problem.nx - 2 * b} x {problem.nz - 2 * b} cells of {problem.dx:g} m "
        f"(absorbing layer of {b} cells cropped), {problem.nt} steps of "
        f"{problem.dt * 1e3:.2f} ms\nu: the wavefield, in the units of the source",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def burgers_demo(
    n_cells: int = 1024,
    t_final: float = 0.5,
    nu: float = 0.01,
    snapshots: int = 30,
    sensors: int = 0,
    png: str | None = "burgers_gradient.png",
    reference: bool = True,
    out: Callable[[str], None] = print,
) -> dict:
    """Initial-condition gradient of 1-D viscous Burgers under three schedules.

    Revolve, Multistage over memory and a temporary zarr disk tier, and
    StoreAll must agree to rounding, and with the store-everything referee
    when `reference` is true; a Taylor test checks the gradient itself.
    `sensors` > 0 adds that many equally spaced sensors read at every step.
    """
    sensor_idx = (
        None if sensors <= 0 else np.linspace(0, n_cells, sensors, endpoint=False).astype(int)
    )
    problem = BurgersProblem(n_cells=n_cells, t_final=t_final, nu=nu, sensors=sensor_idx)
    out(repr(problem))
    points = n_cells * problem.n_steps
    t0 = time.perf_counter()
    value = problem.objective()
    t_forward = time.perf_counter() - t0
    out(
        f"  J(u0_guess) = {value:.6e}   forward sweep {t_forward:.2f} s "
        f"({points / t_forward / 1e6:.0f} Mpoints/s)"
    )
    du = 0.1 * np.cos(2 * np.pi * problem.x) * np.exp(-(((problem.x - 0.4) / 0.2) ** 2))
    grad, result = _check_gradient(problem, snapshots, reference, du, problem.u0_guess, out)
    result.update(objective=value, forward_seconds=t_forward)
    out(f"  |dJ/du0| = {result['gradient_norm']:.6e}")
    if png:
        _plot_burgers(problem, grad, png)
        out(f"  figure written to {png}")
        result["png"] = png
    return result


def _plot_burgers(problem: BurgersProblem, grad: np.ndarray, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    u_final = problem.forward_many(problem.initial_state(), 0, problem.n_steps)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    axes[0].plot(problem.x, problem.u0_true, label="u0 true")
    axes[0].plot(problem.x, problem.u0_guess, label="u0 guess")
    axes[0].plot(problem.x, problem.u_target, label="u(T) target")
    axes[0].plot(problem.x, u_final, "--", label="u(T) from guess")
    axes[0].set_title("initial conditions and final states")
    axes[0].set_xlabel("x")
    axes[0].set_ylabel("u")
    axes[0].legend(fontsize=8)
    axes[1].plot(problem.x, grad / problem.dx)
    axes[1].set_title("L2 gradient dJ/du0 / dx")
    axes[1].set_xlabel("x")
    axes[1].set_ylabel("dJ/du0 / dx")
    fig.suptitle(
        f"viscous Burgers, {problem.n_cells} cells, {problem.n_steps} steps, nu={problem.nu}"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_demo_budget(nx: int, nz: int, memory_states: int, disk_states: int) -> None:
    """Check ``vlcc demo``'s budget, in states, before any work.

    A state of the demo is two ``nz x nx`` float64 fields.  With a disk
    level, three of the memory states are the store's I/O buffers (two being
    written behind the computation, one read ahead), so the memory budget
    must hold four states; without one, one.

    **Raises:** `ValueError` naming the flag, in states, and the smallest
    value that works.
    """
    from ..budget import slots_within

    if disk_states < 0:
        raise VlccValueError(f"--disk-states must be >= 0, got {disk_states}")
    if memory_states < 0:
        raise VlccValueError(f"--memory-states must be >= 0, got {memory_states}")
    state_bytes = 2 * nx * nz * 8
    m, d, reserve = slots_within(
        memory_states * state_bytes, disk_states * state_bytes, state_bytes, leaves=2
    )
    if m < 1:
        plural = "" if memory_states == 1 else "s"
        why = (
            f"with a disk level, {reserve} of the memory states are I/O buffers (two being "
            "written behind, one read ahead), and one more must hold a checkpoint"
            if reserve
            else "one memory state must hold the checkpoint of u_0"
        )
        raise VlccValueError(
            f"--memory-states {memory_states}: a memory budget of {memory_states} "
            f"state{plural} leaves none for checkpoints; {why}: give "
            f"--memory-states {1 + reserve} or more"
        )


def vlcc_demo(
    nx: int = 300,
    nz: int = 300,
    nt: int = 2000,
    memory_states: int = 10,
    disk_states: int = 41,
    png: str | None = "vlcc_demo_gradient.png",
    out: Callable[[str], None] = print,
) -> dict:
    """The main example, behind ``vlcc demo``: a seismic FWI gradient within a
    memory budget, with a temporary zarr store on disk.

    1. :func:`vlcc_adjoint.plan` picks a schedule for a budget of
       `memory_states` states in memory and `disk_states` on disk, from a
       short calibration of the step and the disk;
    2. :func:`vlcc_adjoint.run_adjoint` computes the gradient with that
       schedule and a memory + zarr store (a temporary directory);
    3. checks: the gradient equals, to rounding, the one of a memory-only
       Revolve run, and passes a Taylor test
       (:func:`~vlcc_adjoint._examples.taylor.taylor_check`: the
       second-order remainder shrinks at rate 2 or more at the smallest
       steps where it is above the rounding level of ``J``);
    4. prints the schedule's and the store's statistics and draws the
       gradient.

    **Returns:** a dict of the numbers printed.
    """
    from ..budget import plan
    from ..execute import run_adjoint
    from ..schedules import Revolve

    check_demo_budget(nx, nz, memory_states, disk_states)
    if png:
        from ..plot import check_figure_path

        check_figure_path(png, "png")
    problem = SeismicProblem(nx=nx, nz=nz, nt=nt)
    out("vlcc demo: full-waveform-inversion gradient of a 2-D acoustic wave equation")
    out(f"  {problem!r}")
    u0 = problem.initial_state()
    state_bytes = u0.prev.nbytes + u0.curr.nbytes
    out(
        f"  one state: {state_bytes / 2**20:.2f} MiB; storing all {nt + 1} would take "
        f"{(nt + 1) * state_bytes / 2**30:.2f} GiB"
    )
    t0 = time.perf_counter()
    _ = problem.d_obs  # observed data: one sweep in the true model
    out(f"  observed data: one forward sweep in {time.perf_counter() - t0:.2f} s")

    out(f"\nplanning for {memory_states} states in memory, {disk_states} on disk:")
    budget = plan(
        nt,
        memory_bytes=memory_states * state_bytes,
        disk_bytes=disk_states * state_bytes,
        solver=problem,
        u0=u0,
        adj_final=problem.final_adjoint,
        verbose=lambda text: out(f"  {text}"),
    )
    out(f"\nbudget: {memory_states} states in memory, {disk_states} on disk")
    for line in budget.explain.splitlines():
        out(f"  {line}")
    schedule = budget.schedule
    stats = schedule.stats()
    out(f"\nschedule {schedule!r}")
    out(
        f"  forward steps {stats.forward_count} ({stats.recompute_ratio:.2f} per step), "
        f"adjoint steps {stats.adjoint_count}"
    )
    out(f"  peak slots per level {stats.peak_slots}, writes {stats.writes}, reads {stats.reads}")

    # With a disk level, the zarr tier lives in a temporary directory that
    # the store removes when run_adjoint closes it.
    store = budget.make_store()
    problem.reset_gradient()
    t0 = time.perf_counter()
    run = run_adjoint(
        problem, schedule, problem.initial_state(), problem.final_adjoint, store=store
    )
    seconds = time.perf_counter() - t0
    grad = problem.gradient.copy()
    predicted = budget.predicted_seconds
    out(
        f"\ngradient in {seconds:.2f} s (predicted {predicted:.2f} s): forward "
        f"{run.forward_seconds:.2f} s, adjoint {run.adjoint_seconds:.2f} s, "
        f"in store calls {run.stall_seconds:.2f} s"
    )
    out("store:")
    for line in str(run.store_stats).splitlines():
        out(f"  {line}")

    reference = Revolve(nt, memory_states)
    grad_revolve = problem.gradient_with(reference)
    agreement = _agreement(grad, grad_revolve)
    out(
        f"\ncheck 1: same gradient as {reference!r} in memory: "
        f"max |diff| / max |g| = {agreement:.1e}"
    )
    agree = agreement < 1e-10
    if not agree:
        out(
            f"  FAILED: the gradient differs from the memory-only Revolve run's by "
            f"{agreement:.1e} (> 1e-10): the checkpointed run is wrong"
        )
    out("check 2: the gradient itself, with J(v + h dv) for a smooth bump dv")
    taylor = taylor_check(
        problem.objective,
        problem.v_background,
        _smooth_bump(problem),
        grad,
        floor=_misfit_floor(problem),
    )
    _report_taylor(taylor, out)
    rates0, rates1 = list(taylor.rates0), list(taylor.rates1)
    passed = agree and taylor.passed
    out(f"  gradient check {'PASSED' if passed else 'FAILED'}")
    if not passed:
        out(
            "  the demo's problem, gradient and checks are part of vlcc-adjoint: please "
            "report this failure with the command line and this output"
        )
    result = {
        "seconds": seconds,
        "predicted_seconds": predicted,
        "agreement": agreement,
        "taylor_rates_first": rates0,
        "taylor_rates_second": rates1,
        "passed": passed,
        "schedule": repr(schedule),
        "forward_count": stats.forward_count,
        "stall_seconds": run.stall_seconds,
        "taylor_failures": list(taylor.failures),
        "taylor_caveats": list(taylor.caveats),
    }
    if png:
        _plot_seismic(problem, grad, png)
        out(f"\ngradient image written to {png}")
        result["png"] = png
    return result
