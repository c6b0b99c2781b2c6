"""The Devito drop-in under a gradient-error budget (run by
``test_error_budget.py`` in a process of its own, as the other Devito cases):
``DevitoSolver.run(..., gradient_rtol=...)`` against Devito's own
store-everything gradient."""

import importlib.util
import os
import pathlib
import sys

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "WARNING")

import numpy as np  # noqa: E402

from vlcc_adjoint.devito import DevitoSolver  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("devito_fwi", ROOT / "examples" / "devito_fwi.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def main() -> int:
    p = example.AcousticFWI(shape=(51, 51), nbl=10, nt=200)
    p.compile(pyrevolve=False)
    p.observe()
    exact, _ = p.gradient_store_all()
    exact = exact.astype(np.float64)
    fwd, u = p.op("forward")
    grad_op, _ = p.op("gradient")
    p._reset()
    solver = DevitoSolver(
        fwd,
        grad_op,
        [u],
        forward_kwargs=dict(u=u, src=p.src, rec=p.rec, dt=p.dt),
        reverse_kwargs=dict(u=u, v=p.v, grad=p.grad, residual=p.residual, dt=p.dt),
    )

    def reset():
        for f in (p.v, p.grad):
            f.data_with_halo[:] = 0.0

    rtol = float(sys.argv[1]) if len(sys.argv) > 1 else 1e-3
    result = solver.run(
        p.steps,
        12,
        before_reverse=p._set_residual,
        gradient_rtol=rtol,
        gradient=lambda: np.array(p.grad.data),
        reset_gradient=reset,
    )
    got = np.array(p.grad.data, dtype=np.float64)
    error = float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
    print(
        f"error {error:.3e} estimate {result.error_estimate:.3e} ratio "
        f"{result.compression_ratio:.2f} bound {result.error_budget.bound:.3e} runs "
        f"{len(result.error_budget.runs)}"
    )
    assert error <= rtol, error
    assert result.compression_ratio > 1.5
    return 0


if __name__ == "__main__":
    sys.exit(main())
