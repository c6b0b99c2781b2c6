"""2-D acoustic full-waveform inversion: the velocity gradient, checkpointed.

A Ricker source and a line of receivers near the top of a 2-D acoustic
model (a smooth background plus a Gaussian anomaly for the "true" model).
The gradient of the data misfit w.r.t. the velocity is the adjoint-state
imaging condition accumulated by the hand-written discrete adjoint of the
leapfrog step (``vlcc_adjoint/_examples/seismic.py`` explains the scheme).
The checkpointed run (Revolve, a few snapshots) must reproduce the
store-everything reference exactly.

    python examples/seismic_fwi.py                       # 200x200, 1000 steps
    python examples/seismic_fwi.py --nx 512 --nz 512 --nt 2000 --snapshots 40 --no-reference

The pattern for a parameter gradient: the solver object owns the
accumulator (``problem.gradient``, zeroed by ``reset_gradient``) and its
``adjoint(state, adj, step)`` adds step ``step``'s contribution; the
executor only carries the state adjoint ``lambda``.
"""

from vlcc_adjoint._examples.demo import MIN_GRID, seismic_demo
from vlcc_adjoint.cli import Integer, Parser


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    side = Integer(MIN_GRID, why="the absorbing layer takes 8 cells on each side")
    parser.add_argument("--nx", type=side, default=200, help="grid points in x")
    parser.add_argument("--nz", type=side, default=200, help="grid points in z")
    parser.add_argument("--nt", type=Integer(1), default=1000, help="time steps")
    parser.add_argument("--snapshots", type=Integer(1), default=30, help="Revolve snapshot slots")
    parser.add_argument(
        "--png", default="seismic_gradient.png", help="gradient image ('' for none)"
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the store-everything referee ((nt+1) nz nx floats of memory)",
    )
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    seismic_demo(
        args.nx,
        args.nz,
        args.nt,
        args.snapshots,
        png=args.png or None,
        reference=not args.no_reference,
    )


if __name__ == "__main__":
    main()
