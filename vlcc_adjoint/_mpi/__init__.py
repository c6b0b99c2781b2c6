"""The implementation of :mod:`vlcc_adjoint.mpi` (see that module)."""
