"""Devito FWI gradient, checkpointed by vlcc-adjoint instead of pyrevolve.

A 2-D acoustic problem written with Devito's DSL, in the manner of Devito's
own acoustic example (``examples/seismic/acoustic``): a two-layer model with a
fast circular inclusion, a Ricker source and a line of receivers near the top,
an absorbing (damped) border, second order in time and fourth in space.  The
gradient of the misfit ``J(m) = 0.5 ||d(m) - d_obs||^2`` with respect to the
squared slowness ``m`` is the adjoint-state imaging condition
``grad = -sum_t u[t] * v.dt2[t]`` (Devito's ``GradientOperator``), computed
four ways:

1. Devito's store-everything gradient: ``u`` saved at every time step
   (``save=nt``), then the gradient operator; the referee;
2. Devito + pyrevolve: ``devito.Revolver`` with ``DevitoCheckpoint([u])``
   and ``CheckpointOperator``s over a 3-level buffered ``u``;
3. the same code with ``vlcc_adjoint.devito.Revolver``: the one-line swap;
4. the same again with a memory + zarr-disk ``Multistage`` schedule and its
   prefetching ``TieredStore``.

    python examples/devito_fwi.py                   # 101x101, 500 steps
    python examples/devito_fwi.py --nx 201 --nz 201 --nt 1000 --snapshots 10

The first run compiles the operators (a few seconds each with gcc; Devito
caches them).  Environment: ``DEVITO_LANGUAGE=C DEVITO_ARCH=gcc`` (the
defaults set below), ``OMP_NUM_THREADS`` with ``DEVITO_LANGUAGE=openmp``.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "WARNING")

import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from vlcc_adjoint.cli import Integer, Parser  # noqa: E402

#: Width of the damped border, in grid points.
NBL = 20


def ricker(f0: float, t: np.ndarray, t0: float | None = None) -> np.ndarray:
    """Ricker wavelet of peak frequency `f0` (kHz, `t` in ms), centred at `t0`
    (default ``1 / f0``)."""
    t0 = 1.0 / f0 if t0 is None else t0
    a = (np.pi * f0 * (t - t0)) ** 2
    return (1.0 - 2.0 * a) * np.exp(-a)


class AcousticFWI:
    """A small Devito acoustic FWI problem: fields, operators, four gradients.

    **Arguments:**

    - `shape`: grid points ``(nx, nz)``, absorbing border included.
    - `spacing`: grid spacing in m.
    - `nbl`: width of the damped border, in points.
    - `nt`: time samples; the time loop runs ``nt - 2`` steps
      (``t = 1 .. nt - 2``, as Devito's acoustic example).
    - `f0`: Ricker peak frequency in kHz (times in ms, velocities in km/s).
    - `space_order`: spatial order of the stencils.
    """

    def __init__(self, shape=(101, 101), spacing=10.0, nbl=NBL, nt=500, f0=0.010, space_order=4):
        from devito import Function, Grid, SparseTimeFunction, TimeFunction

        nx, nz = shape
        self.shape, self.nt, self.space_order = tuple(shape), int(nt), space_order
        self.grid = grid = Grid(
            shape=shape, extent=((nx - 1) * spacing, (nz - 1) * spacing), dtype=np.float32
        )
        x = np.arange(nx)[:, None] * spacing
        z = np.arange(nz)[None, :] * spacing
        # Two layers (1.5 over 2.5 km/s); the truth adds a 3.0 km/s disc.
        vp0 = np.where(z < 0.45 * nz * spacing, 1.5, 2.5) + 0 * x
        disc = (x - 0.5 * nx * spacing) ** 2 + (z - 0.62 * nz * spacing) ** 2 < (
            0.12 * nx * spacing
        ) ** 2
        vp_true = np.where(disc, 3.0, vp0)
        self.m0 = Function(name="m", grid=grid, space_order=space_order)
        self.m0.data[:] = 1.0 / vp0**2
        self.m_true = Function(name="m_true", grid=grid, space_order=space_order)
        self.m_true.data[:] = 1.0 / vp_true**2
        # Damping: a quadratic ramp across the border (1/ms).
        self.damp = Function(name="damp", grid=grid)
        dist = np.minimum(
            np.minimum(np.arange(nx), np.arange(nx)[::-1])[:, None],
            np.minimum(np.arange(nz), np.arange(nz)[::-1])[None, :],
        )
        ramp = np.clip((nbl - dist) / nbl, 0.0, 1.0)
        self.damp.data[:] = 0.2 * ramp**2
        self.dt = np.float32(0.4 * spacing / 3.0)  # CFL 0.4 at the fastest speed
        time_axis = np.arange(nt) * self.dt

        depth = (nbl + 2) * spacing
        self.src = SparseTimeFunction(name="src", grid=grid, npoint=1, nt=nt)
        self.src.coordinates.data[:] = [0.5 * (nx - 1) * spacing, depth]
        self.src.data[:, 0] = ricker(f0, time_axis)
        xr = np.linspace(nbl * spacing, (nx - 1 - nbl) * spacing, max(nx - 2 * nbl, 2))
        self.rec = SparseTimeFunction(name="rec", grid=grid, npoint=xr.size, nt=nt)
        self.rec.coordinates.data[:] = np.stack([xr, np.full_like(xr, depth)], axis=1)
        self.residual = SparseTimeFunction(name="residual", grid=grid, npoint=xr.size, nt=nt)
        self.residual.coordinates.data[:] = self.rec.coordinates.data

        # Buffered wavefields (3 time levels) for the checkpointed runs.
        self.u = TimeFunction(name="u", grid=grid, time_order=2, space_order=space_order)
        self.v = TimeFunction(name="v", grid=grid, time_order=2, space_order=space_order)
        self.grad = Function(name="grad", grid=grid)
        self._ops: dict = {}
        self.d_obs = None

    # -- operators -------------------------------------------------------------
    def _forward_op(self, u):
        from devito import Eq, Operator, solve

        m, s = self.m0, self.grid.stepping_dim.spacing
        pde = m * u.dt2 - u.laplace + self.damp * u.dt
        return Operator(
            [Eq(u.forward, solve(pde, u.forward))]
            + self.src.inject(field=u.forward, expr=self.src * s**2 / m)
            + self.rec.interpolate(expr=u),
            name="Forward",
        )

    def _gradient_op(self, u):
        from devito import Eq, Inc, Operator, solve

        m, v, s = self.m0, self.v, self.grid.stepping_dim.spacing
        pde = m * v.dt2 - v.laplace + self.damp * v.dt.T
        return Operator(
            [Eq(v.backward, solve(pde, v.backward))]
            + self.residual.inject(field=v.backward, expr=self.residual * s**2 / m)
            + [Inc(self.grad, -u * v.dt2)],
            name="Gradient",
        )

    def op(self, kind: str, save: bool = False):
        """The ``"forward"`` or ``"gradient"`` operator, over the buffered
        ``u`` or (``save=True``) a ``u`` saved at every step; built once."""
        key = (kind, save)
        if key not in self._ops:
            from devito import TimeFunction

            u = (
                TimeFunction(
                    name="u",
                    grid=self.grid,
                    time_order=2,
                    space_order=self.space_order,
                    save=self.nt,
                )
                if save
                else self.u
            )
            build = self._forward_op if kind == "forward" else self._gradient_op
            self._ops[key] = (build(u), u)
        return self._ops[key]

    @property
    def steps(self) -> int:
        """Forward steps of the time loop (``t = 1 .. nt - 2``)."""
        return self.nt - 2

    def compile(self, reference: bool = True, pyrevolve: bool = True) -> float:
        """Build and JIT-compile the operators; the seconds it took."""
        t0 = time.perf_counter()
        for save in (False, True) if reference else (False,):
            for kind in ("forward", "gradient"):
                _ = self.op(kind, save)[0].cfunction  # reading it compiles the operator
        return time.perf_counter() - t0

    # -- runs ------------------------------------------------------------------
    def _reset(self, u=None):
        for f in (self.u if u is None else u, self.v, self.grad, self.rec, self.residual):
            f.data_with_halo[:] = 0.0

    def observe(self) -> np.ndarray:
        """Synthetic observed data: the forward run in the true model."""
        op, u = self.op("forward")
        self._reset()
        op.apply(u=u, m=self.m_true, dt=self.dt)
        self.d_obs = np.array(self.rec.data)
        return self.d_obs

    def _set_residual(self) -> float:
        """``residual = d(m) - d_obs`` from the receivers; returns ``J``."""
        if self.d_obs is None:
            raise RuntimeError("call observe() first: the residual needs the observed data")
        r = self.rec.data - self.d_obs
        self.residual.data[:] = r
        return 0.5 * float(np.sum(r.astype(np.float64) ** 2))

    def gradient_store_all(self) -> tuple[np.ndarray, float]:
        """Devito's store-everything gradient: ``u`` saved at all ``nt`` steps."""
        fwd, u_save = self.op("forward", save=True)
        grad_op, _ = self.op("gradient", save=True)
        self._reset(u_save)
        fwd.apply(u=u_save, dt=self.dt)
        misfit = self._set_residual()
        grad_op.apply(u=u_save, v=self.v, grad=self.grad, residual=self.residual, dt=self.dt)
        return np.array(self.grad.data), misfit

    def gradient_checkpointed(self, Revolver, n_checkpoints=None, **revolver_options):
        """The gradient through a pyrevolve-style ``Revolver``: pass
        ``devito.Revolver`` (pyrevolve) or ``vlcc_adjoint.devito.Revolver``;
        the code is the same.  Returns ``(grad, J, revolver)``."""
        from devito import CheckpointOperator, DevitoCheckpoint

        fwd, u = self.op("forward")
        grad_op, _ = self.op("gradient")
        self._reset()
        cp = DevitoCheckpoint([u])
        wrap_fw = CheckpointOperator(fwd, u=u, src=self.src, rec=self.rec, dt=self.dt)
        wrap_rev = CheckpointOperator(
            grad_op, u=u, v=self.v, grad=self.grad, residual=self.residual, dt=self.dt
        )
        wrp = Revolver(cp, wrap_fw, wrap_rev, n_checkpoints, self.steps, **revolver_options)
        wrp.apply_forward()
        misfit = self._set_residual()
        wrp.apply_reverse()
        return np.array(self.grad.data), misfit, wrp

    def gradient_vlcc(self, schedule=None, store=None, recompute=None):
        """The gradient through :class:`vlcc_adjoint.devito.DevitoSolver`
        (Devito operators and their arguments, no pyrevolve).  Returns
        ``(grad, J, AdjointResult)``."""
        from vlcc_adjoint.devito import DevitoSolver

        fwd, u = self.op("forward")
        grad_op, _ = self.op("gradient")
        self._reset()
        solver = DevitoSolver(
            fwd,
            grad_op,
            [u],
            forward_kwargs=dict(u=u, src=self.src, rec=self.rec, dt=self.dt),
            reverse_kwargs=dict(u=u, v=self.v, grad=self.grad, residual=self.residual, dt=self.dt),
            recompute=recompute,
        )
        box = {}
        result = solver.run(
            self.steps,
            schedule,
            store,
            before_reverse=lambda: box.setdefault("J", self._set_residual()),
        )
        return np.array(self.grad.data), box["J"], result


def rel_max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """``max |a - b| / max |b|``."""
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    side = Integer(
        2 * NBL + 1, why=f"the damped border takes {NBL} points on each side, the interior one"
    )
    parser.add_argument("--nx", type=side, default=101, help="grid points in x")
    parser.add_argument("--nz", type=side, default=101, help="grid points in z")
    parser.add_argument("--nt", type=Integer(4), default=500, help="time samples (nt - 2 steps)")
    parser.add_argument(
        "--snapshots",
        type=Integer(1),
        default=None,
        help="Revolve snapshots (default: pyrevolve's choice)",
    )
    parser.add_argument("--png", default="devito_gradient.png", help="gradient image ('' for none)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)

    from vlcc_adjoint import Level, Multistage, Revolve, io_plan, plan
    from vlcc_adjoint.devito import Revolver as VlccRevolver
    from vlcc_adjoint.devito import default_snapshots
    from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier

    problem = AcousticFWI(shape=(args.nx, args.nz), nt=args.nt)
    n = problem.steps
    snapshots = args.snapshots or default_snapshots(n)
    print(
        f"Devito acoustic FWI: grid {args.nx}x{args.nz}, {n} steps, "
        f"{snapshots} snapshots of 2 time levels"
    )
    print(f"compiling operators: {problem.compile():.1f} s")
    problem.observe()
    Revolve(8, 2)  # the planners are numba code: load it before the clocks start

    rows = []

    def timed(name, fn):
        t0 = time.perf_counter()
        grad, misfit, *rest = fn()
        rows.append((name, time.perf_counter() - t0, grad, misfit))
        return rest

    timed("Devito store-all (save=nt)", problem.gradient_store_all)
    try:
        from devito import Revolver as PyRevolver

        timed(
            f"Devito + pyrevolve, {snapshots} snapshots",
            lambda: problem.gradient_checkpointed(PyRevolver, snapshots),
        )
    except ImportError:
        print("pyrevolve is not installed: skipping its gradient")
    (wrp,) = timed(
        f"vlcc Revolver (drop-in), {snapshots} snapshots",
        lambda: problem.gradient_checkpointed(VlccRevolver, snapshots),
    )

    # Fewer snapshots in memory, more on disk: Multistage over memory + zarr,
    # with the disk's write / read times measured by a budget plan.
    step_seconds = rows[0][1] / (2 * n)  # one forward or gradient iteration
    state_bytes = 2 * problem.u._data_allocated[0].nbytes  # two time levels
    memory, disk = max(4, snapshots // 2), 2 * snapshots
    budget = plan(
        n,
        memory * state_bytes,
        disk * state_bytes,
        state_bytes=state_bytes,
        step_seconds=step_seconds,
    )
    schedule = Multistage(
        n,
        [
            Level(memory),
            Level(disk, budget.write_seconds / step_seconds, budget.read_seconds / step_seconds),
        ],
    )
    with tempfile.TemporaryDirectory(prefix="vlcc-devito-") as tmp:
        store = TieredStore([MemoryTier(), ZarrTier(tmp)], plan=io_plan(schedule))
        (result,) = timed(
            f"vlcc Multistage, memory {memory} + zarr disk {disk}",
            lambda: problem.gradient_vlcc(schedule, store),
        )

    reference, misfit_ref = rows[0][2], rows[0][3]
    print(f"\nmisfit J = {misfit_ref:.6e}; max |grad| = {np.max(np.abs(reference)):.4e}")
    print(f"{'run':48s} {'seconds':>8s} {'rel. max diff':>14s}")
    for name, seconds, grad, misfit in rows:
        print(f"{name:48s} {seconds:8.2f} {rel_max_diff(grad, reference):14.2e}")
    print(
        f"\nvlcc Revolver: {wrp.schedule!r}, forward steps {wrp.result.forward_steps}, "
        f"reverse recomputes a forward step: {wrp.solver.recompute}"
    )
    print(
        f"vlcc Multistage: forward steps {result.forward_steps}, "
        f"stall {result.stall_seconds:.3f} s of {result.wall_seconds:.2f} s"
    )
    worst = max(rel_max_diff(g, reference) for _, _, g, _ in rows)
    if args.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 4.8), constrained_layout=True)
            g = rows[-1][2].T  # Devito's arrays are [x, z]: rows of the image are depths
            lim = float(np.percentile(np.abs(g), 99.5)) or 1.0
            hx, hz = (s / 1e3 for s in problem.grid.spacing)  # m -> km
            extent = (0.0, (args.nx - 1) * hx, (args.nz - 1) * hz, 0.0)
            im = ax.imshow(g, cmap="seismic", vmin=-lim, vmax=lim, extent=extent)
            ax.set_title("Devito FWI gradient (vlcc Multistage)")
            ax.set_xlabel("x (km)")
            ax.set_ylabel("depth z (km)")
            fig.colorbar(
                im,
                ax=ax,
                shrink=0.9,
                label="dJ/dm per grid point (m: squared slowness, s$^2$/km$^2$)",
            )
            fig.savefig(args.png, dpi=100)
            print(f"gradient image: {args.png}")
        except ImportError:
            pass
    return worst


if __name__ == "__main__":
    worst = main()
    raise SystemExit(0 if worst < 1e-5 else 1)
