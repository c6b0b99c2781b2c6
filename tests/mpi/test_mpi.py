"""vlcc_adjoint.mpi: SPMD adjoints, one shared zarr hierarchy, failures that never hang.

The MPI tests launch ``mpiexec -n 2`` / ``-n 4`` on the scripts in
``tests/mpi/mpi_scripts/`` (oversubscribed on a 2-core machine: MPICH allows it
by default) and check what they write and print:

- the distributed seismic gradient and objective equal the serial
  store-everything ones bit for bit (2 and 4 ranks, memory and shared-zarr
  stores, with commits during the run);
- the halo exchange's ``accumulate`` is its exact transpose (dot-product
  test on a 2 x 2 and a 3 x 1 process grid);
- a checkpoint written by 4 ranks (uneven blocks, a 2-D process grid, a
  3-D array, replicated values) is read back by 2 and by 3 ranks, serially,
  and by plain ``zarr.open_group``; every chunk has exactly one writer;
- a rank that raises, hangs, holds another schedule, or fails to write
  makes every rank exit with the error within a bounded time (the
  subprocess timeout is the "no hang" assertion);
- ``examples/mpi_seismic.py`` runs.

Referees: the serial ``SeismicProblem.reference_gradient`` (which the
serial tests validate by dot-product and Taylor tests), and the global
arrays the checkpoint script builds from closed-form functions.
Without mpi4py or mpiexec the MPI tests skip; the decomposition tests run
anyway.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from vlcc_adjoint.mpi import Decomposition, DistributedArray, storage_layout
from vlcc_adjoint.state import flatten, unflatten

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "mpi" / "mpi_scripts"
sys.path.insert(0, str(SCRIPTS))

HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
MPIEXEC = shutil.which(
    "mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
)
needs_mpi = pytest.mark.skipif(
    not (HAVE_MPI4PY and MPIEXEC), reason="needs mpi4py and mpiexec (pip install mpi4py mpich)"
)


def _mpiexec(n: int, *argv, timeout: float = 120.0, cwd=None):
    """Run ``mpiexec -n n python argv...``; returns (process, seconds)."""
    env = dict(
        os.environ,
        NUMBA_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    return proc, time.perf_counter() - t0


def _rank_lines(out: str) -> list[str]:
    """The ``rank R: Type: message`` reports of ``failure.py``.  mpiexec may
    forward two ranks' lines glued together (``...onesrank 1: ...``, the
    newlines after them), so split on the pattern, not on newlines."""
    parts = re.split(r"(?=rank \d+: [A-Z]\w*: )", out)
    return [p.strip() for p in parts if re.match(r"rank \d+: [A-Z]\w*: ", p)]


def _ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


@pytest.fixture(scope="module")
def reference():
    """The serial store-everything gradient and objective of the test problem;
    also compiles (or loads) every kernel once, so that the ranks do not
    compile them concurrently."""
    from mpi_problem import problem_kwargs

    from vlcc_adjoint._examples.mpi_seismic import compile_kernels
    from vlcc_adjoint._examples.seismic import SeismicProblem

    compile_kernels()
    return SeismicProblem(**problem_kwargs()).reference_gradient(return_objective=True)


# ---------------------------------------------------------------------------
# decompositions and the state provider (no MPI)
# ---------------------------------------------------------------------------


def test_split_decomposition_matches_numpy_array_split_and_row_major_ranks():
    d = Decomposition.split((50, 9), (4, 2))
    assert d.dims == (4, 2) and d.nranks == 8
    assert [b - a for a, b in zip(d.bounds[0], d.bounds[0][1:])] == [13, 13, 12, 12]
    assert d.coords(5) == (2, 1) and d.rank_of((2, 1)) == 5  # C order, as Devito/MPI_Cart
    assert d.block(5) == ((26, 38), (5, 9))
    cover = np.zeros((50, 9), int)
    for r in range(d.nranks):
        cover[d.slices(r)] += 1
    assert (cover == 1).all()
    assert d.neighbour(5, 0, -1) == 3 and d.neighbour(1, 0, -1) is None


def test_chunk_shape_is_the_gcd_of_interior_boundaries_so_no_chunk_spans_two_blocks():
    d = Decomposition.from_sizes([[12, 8, 16], [10]])  # boundaries 12, 20
    assert d.chunk_shape == (4, 10)
    assert d.is_aligned(d.chunk_shape) and not d.is_aligned((8, 10))
    owners = {}
    for r in range(d.nranks):
        for idx in d.chunks_of(r):
            assert idx not in owners, "two ranks would write one chunk"
            owners[idx] = r
    assert len(owners) == 9  # 36 rows / 4


def test_storage_layout_keeps_aligned_blocks_and_moves_uneven_splits():
    aligned = Decomposition.aligned((1001, 64), (4, 1))
    assert aligned.bounds[0] == (0, 251, 502, 753, 1001)
    assert storage_layout(aligned) == (aligned, (251, 64))
    devito = Decomposition.split((1001, 64), (4, 1))  # 251, 250, 250, 250: gcd 1
    layout, chunks = storage_layout(devito)
    assert devito.chunk_shape == (1, 64) and layout == aligned and chunks == (251, 64)
    equal = Decomposition.split((512, 64), (4, 1))
    assert storage_layout(equal) == (equal, (128, 64))


def test_ranks_overlapping_finds_exactly_the_intersecting_blocks():
    d = Decomposition.split((23, 17), (3, 2))
    rng = np.random.default_rng(0)
    for _ in range(200):
        lo = rng.integers(0, [23, 17])
        hi = lo + rng.integers(0, 8, 2)
        box = tuple((int(a), int(min(b, n))) for a, b, n in zip(lo, hi, (23, 17)))
        brute = [
            r
            for r in range(d.nranks)
            if all(max(a, x) < min(b, y) for (a, b), (x, y) in zip(box, d.block(r)))
        ]
        assert list(d.ranks_overlapping(box)) == brute


def test_distributed_array_composes_with_the_other_providers_through_json():
    d = Decomposition.split((10, 4), (3, 1))
    block = np.arange(12.0).reshape(3, 4)
    state = {"u": DistributedArray(block, d, 1), "t": 0.5, "tag": ("a", 3)}
    leaves, spec = flatten(state)
    spec = json.loads(json.dumps(spec))
    back = unflatten(spec, leaves)
    assert isinstance(back["u"], DistributedArray) and back["u"].rank == 1
    assert back["u"].decomposition == d and back["u"].slices == (slice(4, 7), slice(0, 4))
    np.testing.assert_array_equal(back["u"].local, block)
    with pytest.raises(ValueError, match="without halos"):
        DistributedArray(np.zeros((5, 4)), d, 1)


def test_schedule_fingerprint_tells_schedules_apart():
    from vlcc_adjoint.mpi import schedule_fingerprint
    from vlcc_adjoint.schedules import Revolve

    assert schedule_fingerprint(Revolve(100, 5)) == schedule_fingerprint(Revolve(100, 5))
    assert schedule_fingerprint(Revolve(100, 5)) != schedule_fingerprint(Revolve(100, 6))


# ---------------------------------------------------------------------------
# one rank, in process: the SPMD path is the serial computation, bit for bit
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_MPI4PY, reason="needs mpi4py")
def test_one_rank_spmd_run_with_a_shared_hierarchy_is_bitwise_the_serial_gradient(
    tmp_path, reference
):
    from mpi4py import MPI
    from mpi_problem import problem_kwargs

    from vlcc_adjoint import run_adjoint
    from vlcc_adjoint._examples.mpi_seismic import DistributedSeismic
    from vlcc_adjoint.mpi import DistributedStore, SharedZarrTier, list_checkpoints
    from vlcc_adjoint.schedules import Level, Multistage, io_plan
    from vlcc_adjoint.storage import MemoryTier

    kw = problem_kwargs()
    comm = MPI.COMM_SELF
    solver = DistributedSeismic(comm, **kw)
    schedule = Multistage(kw["nt"], [Level(2, 0.1, 0.1), Level(5, 1.0, 1.0)])
    store = DistributedStore(
        comm,
        [MemoryTier(), SharedZarrTier(tmp_path / "h", comm)],
        io_plan(schedule),
        commit_every=1,
    )
    solver.d_obs  # noqa: B018
    result = run_adjoint(
        solver, schedule, solver.initial_state(), solver.final_adjoint, store=store, comm=comm
    )
    np.testing.assert_array_equal(solver.gather_gradient(), reference[1])
    assert result.reduced.nranks == 1
    assert result.reduced.records_committed == schedule.stats().writes[1]  # one commit per save
    assert result.reduced.bytes_written[1] > 0
    assert list_checkpoints(tmp_path / "h") == []  # every record was deleted by the schedule


# ---------------------------------------------------------------------------
# under mpiexec
# ---------------------------------------------------------------------------


@needs_mpi
@pytest.mark.parametrize("ranks, store", [(2, "memory"), (2, "shared"), (4, "shared")])
def test_mpi_gradient_equals_the_serial_gradient_bit_for_bit(tmp_path, reference, ranks, store):
    objective, gradient = reference
    args = ["--out", tmp_path, "--store", store]
    if ranks == 4:
        args += ["--commit-every", "2"]  # records committed (and deleted) during the run
    proc, _ = _mpiexec(ranks, SCRIPTS / "seismic_gradient.py", *args)
    _ok(proc)
    got = np.load(tmp_path / "gradient.npy")
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["nranks"] == ranks
    # Every rank runs the serial kernels on its rows, with its neighbours'
    # rows of u and of a c beta' in the halos: the serial arithmetic exactly.
    assert doc["objective"] == objective
    np.testing.assert_array_equal(got, gradient)
    if store == "shared":
        assert doc["bytes_written"][1] > 0
        assert doc["left"] == [] and doc["pending"] == ["zarr.json"]  # nothing leaks
        if ranks == 4:  # committed every 2 saves, unless deleted before their commit
            assert 0 < doc["records_committed"] <= doc["schedule_writes"][1]


@needs_mpi
@pytest.mark.parametrize("ranks", [4, 3])
def test_halo_accumulate_is_the_exact_transpose_of_the_exchange(ranks):
    proc, _ = _mpiexec(ranks, SCRIPTS / "halo_dot.py")
    out = json.loads(_ok(proc).strip().splitlines()[-1])
    assert all(c["rel"] < 1e-14 for c in out["checks"].values())


@needs_mpi
def test_checkpoint_written_by_4_ranks_restores_on_2_3_and_1_and_opens_with_plain_zarr(tmp_path):
    import zarr
    from checkpoint_io import expected

    from vlcc_adjoint.mpi import list_checkpoints, read_checkpoint

    path = tmp_path / "h"
    proc, _ = _mpiexec(4, SCRIPTS / "checkpoint_io.py", "write", path)
    name = json.loads(_ok(proc).strip().splitlines()[-1])["name"]
    for q in (2, 3):
        proc, _ = _mpiexec(q, SCRIPTS / "checkpoint_io.py", "read", path, name)
        assert json.loads(_ok(proc).strip().splitlines()[-1]) == {"verified_ranks": q}

    glob = expected()
    (rec,) = list_checkpoints(path)
    assert rec["name"] == name and rec["nranks"] == 4 and rec["step"] == 7
    serial = read_checkpoint(path, step=7)  # one reader, no MPI: whole arrays
    for key, arr in glob.items():
        np.testing.assert_array_equal(serial[key].local, arr)
    assert serial["t"] == 0.25 and serial["meta"]["name"] == "wave"

    root = zarr.open_group(str(path), mode="r")
    group = root[name]
    attrs = group.attrs["vlcc_adjoint"]
    for i, key in enumerate(["u", "v", "c"]):  # flatten order: dict insertion order
        arr = group[str(i)]
        np.testing.assert_array_equal(arr[...], glob[key])
        # every chunk lies in one block of the layout it was written in: one writer each
        leaf = attrs["leaves"][i]
        d = Decomposition.from_json(leaf["decomposition"])
        assert tuple(arr.chunks) == tuple(leaf["chunk_shape"]) and d.is_aligned(arr.chunks)
        owners = [idx for r in range(d.nranks) for idx in d.chunks_of(r, arr.chunks)]
        assert sorted(owners) == sorted(set(owners)) and len(owners) == int(
            np.prod(arr.cdata_shape)
        )
    np.testing.assert_array_equal(group["3"][...], np.arange(5, dtype=np.int16))
    # "u" was split 13/13/12/12 (gcd 1): stored in the aligned layout, one chunk per rank
    assert tuple(group["0"].chunks) == (13, 7)


@needs_mpi
def test_a_rank_that_raises_stops_every_rank_with_its_error(tmp_path):
    proc, seconds = _mpiexec(4, SCRIPTS / "failure.py", "raise", tmp_path, timeout=90)
    lines = _rank_lines(proc.stdout)
    assert proc.returncode != 0 and len(lines) == 4, proc.stdout + proc.stderr[-3000:]
    assert any(ln.startswith("rank 2: ValueError: injected failure") for ln in lines)
    others = [ln for ln in lines if not ln.startswith("rank 2:")]
    assert all(
        "RankFailedError: rank 2 failed with ValueError: injected failure" in ln for ln in others
    )
    assert seconds < 60


@needs_mpi
def test_a_hung_rank_ends_in_a_timeout_and_an_abort_not_a_hang(tmp_path):
    # rank 1 sleeps for ten minutes; the others time out after 3 s, report,
    # wait 3 s for an acknowledgement that cannot come, and abort the job.
    # (The abort tears the job down at once: the launcher may drop the last
    # lines of output, so only the first reports are required.)
    proc, seconds = _mpiexec(4, SCRIPTS / "failure.py", "hang", tmp_path, timeout=90)
    assert proc.returncode != 0
    assert "CollectiveTimeoutError" in proc.stdout + proc.stderr
    assert seconds < 60


@needs_mpi
def test_ranks_with_different_schedules_all_raise_schedule_mismatch(tmp_path):
    proc, _ = _mpiexec(2, SCRIPTS / "failure.py", "schedule", tmp_path, timeout=90)
    lines = _rank_lines(proc.stdout)
    assert proc.returncode != 0 and len(lines) == 2
    assert all("ScheduleMismatchError: the ranks hold different schedules" in ln for ln in lines)
    assert all("ranks [0] hold" in ln and "ranks [1] hold" in ln for ln in lines)


@needs_mpi
def test_a_failed_checkpoint_write_on_one_rank_fails_every_rank_and_commits_nothing(tmp_path):
    from vlcc_adjoint.mpi import list_checkpoints

    proc, _ = _mpiexec(2, SCRIPTS / "failure.py", "write", tmp_path, timeout=90)
    lines = _rank_lines(proc.stdout)
    assert proc.returncode != 0 and len(lines) == 2, proc.stdout + proc.stderr[-3000:]
    assert any("rank 1: StorageError" in ln and "No space left" in ln for ln in lines)
    assert any(ln.startswith("rank 0: RankFailedError: rank 1 failed") for ln in lines)
    assert list_checkpoints(tmp_path / "ckpt") == []


@needs_mpi
def test_mpi_seismic_example_runs_and_matches_the_serial_gradient(tmp_path):
    proc, _ = _mpiexec(
        2,
        ROOT / "examples" / "mpi_seismic.py",
        "--nx",
        60,
        "--nz",
        50,
        "--nt",
        150,
        "--memory-slots",
        3,
        "--disk-slots",
        6,
        "--check",
        "--dir",
        tmp_path / "h",
        cwd=tmp_path,
    )
    out = _ok(proc)
    diff = float(re.search(r"max \|diff\| / max \|g\| = ([0-9.e+-]+)", out).group(1))
    assert diff < 1e-12
    assert "written by 2 ranks, read by 1" in out


_DEFERRED = """
import sys
import mpi4py
mpi4py.rc(initialize=False, finalize=False)  # as Devito does when it is imported
from mpi4py import MPI
from vlcc_adjoint.mpi import SharedZarrTier
{before}
tier = SharedZarrTier(sys.argv[1], MPI.COMM_SELF)
print("size", tier.size, "initialized", MPI.Is_initialized())
"""


@pytest.mark.skipif(not HAVE_MPI4PY, reason="needs mpi4py")
@pytest.mark.parametrize(
    "before, said",
    [
        ("", "size 1 initialized True"),
        ("MPI.Init(); MPI.Finalize()", "RuntimeError: MPI is finalized already"),
    ],
)
def test_mpi_deferred_by_another_library_is_initialised_not_a_silent_exit(tmp_path, before, said):
    """A library imported first (Devito) may defer MPI's initialisation; an MPI
    call would then end the process with status 1 and no message.  Our classes
    initialise MPI as mpi4py would (and finalise it at exit); after MPI_Finalize
    they raise a message."""
    proc = subprocess.run(
        [sys.executable, "-c", _DEFERRED.format(before=before), str(tmp_path / "h")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert said in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert proc.returncode == (0 if not before else 1)
