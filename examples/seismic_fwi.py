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

import argparse

from vlcc_adjoint._examples.demo import seismic_demo


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nx", type=int, default=200)
    parser.add_argument("--nz", type=int, default=200)
    parser.add_argument("--nt", type=int, default=1000, help="time steps")
    parser.add_argument("--snapshots", type=int, default=30, help="Revolve snapshot slots")
    parser.add_argument(
        "--png", default="seismic_gradient.png", help="gradient image ('' for none)"
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the store-everything referee ((nt+1) nz nx floats of memory)",
    )
    args = parser.parse_args(argv)
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
