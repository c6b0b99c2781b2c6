"""The test problem shared by the MPI scripts and tests/mpi/test_mpi.py."""

import numpy as np


def problem_kwargs(nt: int = 150) -> dict:
    # Small, non-square; 50 rows split over 4 ranks as numpy.array_split does
    # (13, 13, 12, 12: uneven blocks, as Devito makes them); receivers along
    # the bottom, the source near the top, so both the forward wave and the
    # adjoint source cross every block boundary.
    nz, nx, nbl = 50, 36, 6
    xs = np.arange(nbl, nx - nbl, 2)
    return dict(
        nx=nx,
        nz=nz,
        nt=nt,
        dx=10.0,
        f0=25.0,
        nbl=nbl,
        receivers=(np.full(xs.size, nz - nbl - 2), xs),
    )
