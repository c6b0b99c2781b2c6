"""Full-waveform-inversion gradient of a 2-D acoustic wave in JAX, in a small memory budget.

The forward model is the constant-density acoustic wave equation

    u_tt = c(x, z)^2 (u_xx + u_zz) + s(t) delta(x - x_s),

discretised with second-order finite differences in time and space and a
damping sponge at the sides and bottom (a free surface on top).  Shots fire
one after the other from sources along the surface; receivers along the
surface record ``u``.  The misfit between the recorded data and the data of
a "true" model (background plus a fast circular anomaly) is differentiated
with respect to the velocity model ``c``: the FWI gradient, whose sign shows
where the anomaly is.

``jax.lax.scan`` would store every time step for the reverse pass
(``steps x 2 x grid^2`` floats, 1.3 GB at the defaults).  Here
:func:`vlcc_adjoint.jax.checkpointed_scan` keeps ``--snapshots`` states on
the device and recomputes the rest by the Revolve schedule.

    python examples/jax_wave.py                      # 10,000 steps, 128 x 128, 30 slots
    python examples/jax_wave.py --steps 2000 --grid 64 --check   # compare with lax.scan
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from vlcc_adjoint.cli import Integer, Parser
from vlcc_adjoint.jax import checkpointed_scan
from vlcc_adjoint.schedules import Revolve


def ricker(t, f0):
    """The Ricker wavelet of peak frequency `f0` (Hz) at times `t` (s)."""
    a = (np.pi * f0 * (t - 1.2 / f0)) ** 2
    return (1 - 2 * a) * np.exp(-a)


#: The smallest grid side: a damping sponge of at least 4 cells on the sides
#: and the bottom, and an interior of at least 8 cells for the sources (on
#: row 2), the receivers and the anomaly.
GRID_MIN = 16


def make_problem(
    grid: int = 128,
    steps: int = 10_000,
    shots: int = 8,
    dx: float = 10.0,
    f0: float = 8.0,
    dtype=jnp.float32,
):
    """The wave problem: a step function, initial state, per-step inputs, models.

    Returns a dict with ``step(carry, x, c) -> (carry, traces)`` (``carry =
    (u_prev, u)``, ``x = (amplitude, source column)``), ``init``, ``xs``,
    ``c_true``, ``c0`` (the starting model), ``dt`` (s), ``dx`` (m).
    """
    n = grid
    c_back, c_anom = 1500.0, 1800.0
    z, x = np.meshgrid(np.arange(n) * dx, np.arange(n) * dx, indexing="ij")
    centre = n * dx / 2
    c_true = np.where(
        (x - centre) ** 2 + (z - 0.6 * n * dx) ** 2 < (0.15 * n * dx) ** 2, c_anom, c_back
    )
    dt = 0.5 * dx / c_anom  # CFL number 0.5 < 1/sqrt(2)
    # Damping sponge on the sides and the bottom (quadratic ramp, 12 cells).
    width = max(4, n // 10)
    ramp = np.clip(
        (width - np.minimum.reduce([x / dx, (n - 1) - x / dx, (n - 1) - z / dx])) / width, 0, 1
    )
    sigma = 0.5 / dt * ramp**2
    # Shots fire one after another from columns spread along the surface.
    period = max(1, steps // shots)
    t = (np.arange(steps) % period) * dt
    amplitude = ricker(t, f0) * 10.0
    columns = (np.linspace(0.15, 0.85, shots) * n).astype(np.int32)
    column = columns[np.minimum(np.arange(steps) // period, shots - 1)]
    damp_minus = jnp.asarray(1 - sigma * dt, dtype)
    damp_plus = jnp.asarray(1 / (1 + sigma * dt), dtype)
    courant2 = (dt / dx) ** 2

    def step(carry, xs, c):
        u_prev, u = carry
        amp, col = xs
        p = jnp.pad(u, ((0, 1), (1, 1)))  # u = 0 beyond the sides and the bottom
        p = jnp.concatenate([-p[:1], p], axis=0)  # odd mirror above row 0: a free surface
        lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u
        u_next = (2 * u - damp_minus * u_prev + courant2 * (c * c) * lap) * damp_plus
        u_next = u_next.at[2, col].add(amp.astype(u.dtype))
        return (u, u_next), u_next[2, ::2]

    zeros = jnp.zeros((n, n), dtype)
    return dict(
        step=step,
        init=(zeros, zeros),
        xs=(jnp.asarray(amplitude, dtype), jnp.asarray(column)),
        c_true=jnp.asarray(c_true, dtype),
        c0=jnp.full((n, n), c_back, dtype),
        dt=dt,
        dx=dx,
    )


def misfit(problem, observed, *, scan: str = "checkpointed", snapshots: int = 30):
    """``loss(c, init) = 0.5 |d(c) - observed|^2`` with the chosen scan."""
    step = problem["step"]
    n_steps = observed.shape[0]

    def loss(c, init):
        f = lambda carry, x: step(carry, x, c)  # noqa: E731  (c is closed over)
        if scan == "checkpointed":
            _, traces = checkpointed_scan(
                f, init, problem["xs"], schedule=Revolve(n_steps, snapshots)
            )
        else:
            _, traces = jax.lax.scan(f, init, problem["xs"])
        return 0.5 * jnp.sum((traces - observed) ** 2)

    return loss


def build_parser() -> Parser:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", type=Integer(GRID_MIN), default=128, help="grid points per side")
    parser.add_argument("--steps", type=Integer(1), default=10_000, help="time steps")
    parser.add_argument(
        "--snapshots", type=Integer(1), default=30, help="checkpoint slots on the device"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also compute the gradient with plain lax.scan and compare",
    )
    parser.add_argument("--plot", default=None, help="write the gradient image to this PNG")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)

    problem = make_problem(args.grid, args.steps)
    state_bytes = 2 * args.grid**2 * 4
    schedule = Revolve(args.steps, args.snapshots)
    stats = schedule.stats()
    print(
        f"2-D acoustic wave, {args.grid}x{args.grid} grid, {args.steps} steps, "
        f"{args.snapshots} slots; Revolve recomputes {stats.forward_count / args.steps:.2f} "
        "forward steps per step"
    )

    record = jax.jit(
        lambda c: jax.lax.scan(
            lambda carry, x: problem["step"](carry, x, c), problem["init"], problem["xs"]
        )[1]
    )
    observed = record(problem["c_true"])
    loss = misfit(problem, observed, snapshots=args.snapshots)
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    t0 = time.perf_counter()
    compiled = grad.lower(problem["c0"], problem["init"]).compile()
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    value, (g_c, g_u0) = jax.block_until_ready(compiled(problem["c0"], problem["init"]))
    t_grad = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(record(problem["c0"]))
    t_fwd = time.perf_counter() - t0

    plain = jax.jit(jax.value_and_grad(misfit(problem, observed, scan="plain"), argnums=(0, 1)))
    plain_mem = plain.lower(problem["c0"], problem["init"]).compile().memory_analysis()
    ours_mem = compiled.memory_analysis()
    print(
        f"misfit {float(value):.4e}, |grad_c| {float(jnp.linalg.norm(g_c)):.3e}, "
        f"|grad_u0| {float(jnp.linalg.norm(g_u0[1])):.3e}"
    )
    print(
        f"compile {t_compile:.2f} s; gradient {t_grad:.2f} s = {t_grad / t_fwd:.1f} x forward "
        f"({t_fwd:.2f} s)"
    )
    if ours_mem is not None and plain_mem is not None:
        print(
            f"XLA working memory: checkpointed {ours_mem.temp_size_in_bytes / 2**20:.1f} MiB "
            f"(checkpoint buffer {args.snapshots} x {state_bytes / 2**20:.2f} MiB), "
            f"plain lax.scan {plain_mem.temp_size_in_bytes / 2**20:.1f} MiB"
        )
    # Where the anomaly is, the misfit decreases with a faster model: the
    # gradient is negative there.
    mask = np.asarray(problem["c_true"] > 1600)
    inside, outside = float(jnp.mean(g_c[mask])), float(jnp.mean(g_c[~mask]))
    print(f"mean gradient inside the anomaly {inside:.3e}, outside {outside:.3e}")

    if args.check:
        v_ref, (g_ref, _) = plain(problem["c0"], problem["init"])
        err = float(jnp.max(jnp.abs(g_ref - g_c)) / jnp.max(jnp.abs(g_ref)))
        print(
            f"check against lax.scan: misfit {float(v_ref):.4e}, max relative gradient "
            f"difference {err:.2e}"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        side = args.grid * problem["dx"] / 1e3
        extent = (0.0, side, side, 0.0)  # km; depth grows downwards
        fig, ax = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
        im = ax[0].imshow(np.asarray(problem["c_true"]), cmap="viridis", extent=extent)
        ax[0].set_title("true velocity")
        fig.colorbar(im, ax=ax[0], shrink=0.9, label="c (m/s)")
        lim = float(jnp.max(jnp.abs(g_c))) or 1.0
        im = ax[1].imshow(np.asarray(g_c), cmap="seismic", vmin=-lim, vmax=lim, extent=extent)
        ax[1].set_title("misfit gradient w.r.t. the velocity")
        fig.colorbar(im, ax=ax[1], shrink=0.9, label="dJ/dc (u$^2$ s/m per cell)")
        for a in ax:
            a.set_xlabel("x (km)")
            a.set_ylabel("depth z (km)")
        fig.suptitle(
            f"{args.grid} x {args.grid} cells of {problem['dx']:g} m, {args.steps} steps; "
            "u: the wavefield, in the units of the source",
            fontsize=10,
        )
        fig.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
