"""1-D viscous Burgers data assimilation: the initial-condition gradient, checkpointed.

Find the initial condition whose evolution under u_t + (u^2/2)_x = nu u_xx
(periodic, conservative skew-symmetric flux, SSP-RK3) matches a target at
the final time, optionally also at sensors read every step.  The gradient
dJ/du_0 is lambda_0, returned by the hand-written discrete adjoint sweep
(``vlcc_adjoint/_examples/burgers.py`` explains the scheme).  The
checkpointed run (Revolve) must reproduce the store-everything reference.

    python examples/cfd_burgers.py                       # 1024 cells, ~20k steps
    python examples/cfd_burgers.py --cells 4096 --nu 0.005 --sensors 64 --no-reference
"""

from vlcc_adjoint._examples.demo import burgers_demo
from vlcc_adjoint.cli import Integer, Number, Parser


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cells", type=Integer(3), default=1024, help="grid cells (the problem size)"
    )
    parser.add_argument("--t-final", type=Number(above=0.0), default=0.5, help="final time")
    parser.add_argument("--nu", type=Number(0.0), default=0.01, help="viscosity")
    parser.add_argument("--snapshots", type=Integer(1), default=30, help="Revolve snapshot slots")
    parser.add_argument(
        "--sensors", type=Integer(0), default=0, help="sensors read every step (0: none)"
    )
    parser.add_argument("--png", default="burgers_gradient.png", help="figure ('' for none)")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the store-everything referee"
    )
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    burgers_demo(
        args.cells,
        args.t_final,
        args.nu,
        args.snapshots,
        sensors=args.sensors,
        png=args.png or None,
        reference=not args.no_reference,
    )


if __name__ == "__main__":
    main()
