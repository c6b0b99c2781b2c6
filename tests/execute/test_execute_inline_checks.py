"""The executor, a client of the action machine, checks every step's output
(a one-array state too) and records what failed, and the machine which
action, only when something fails: the checks and the notes must be those
of the general matcher, and a failing store call is named with its action."""

import numpy as np
import pytest

from vlcc_adjoint import timestep
from vlcc_adjoint.execute import StateMismatchError, run_adjoint
from vlcc_adjoint.schedules import Revolve


def _solver(bad_step=None, make_bad=None):
    @timestep
    def step(u, i):
        out = u * 0.99 + 0.01
        return make_bad(out) if i == bad_step else out

    @step.adjoint
    def step_adjoint(u, lam, i):
        return lam * 0.99

    return step


@pytest.mark.parametrize(
    "make_bad, what",
    [
        (lambda u: u.astype(np.float32), r"dtype <f4, expected shape \(6,\) and dtype <f8"),
        (lambda u: u[:-1], r"shape \(5,\)"),
        (lambda u: u.reshape(2, 3), r"shape \(2, 3\)"),
        (lambda u: list(u), "is a list, expected a array"),
        (lambda u: u.astype(">f8"), "dtype >f8"),
    ],
)
def test_a_one_array_state_of_another_dtype_shape_or_type_is_named_at_its_step(make_bad, what):
    with pytest.raises(StateMismatchError, match=r"forward step 13 .*" + what) as info:
        run_adjoint(_solver(13, make_bad), Revolve(40, 4), np.ones(6), lambda u: u)
    notes = "\n".join(info.value.__notes__)
    assert "forward step 13" in notes and "Advance" in notes


def test_an_equal_dtype_built_anew_passes_the_inline_check():
    fresh = np.dtype("<f8").newbyteorder("<")  # equal to float64, another object
    assert fresh == np.ones(1).dtype and fresh is not np.ones(1).dtype
    plain = run_adjoint(_solver(), Revolve(30, 3), np.ones(6), lambda u: u)
    anew = run_adjoint(
        _solver(7, lambda u: u.astype(fresh)), Revolve(30, 3), np.ones(6), lambda u: u
    )
    assert np.array_equal(plain.adjoint, anew.adjoint)


def test_a_failing_step_deep_in_a_long_advance_is_named_with_its_action():
    @timestep
    def step(u, i):
        if i == 977:
            raise FloatingPointError("blew up")
        return u * 0.5

    step.adjoint(lambda u, lam, i: lam)
    with pytest.raises(FloatingPointError) as info:
        run_adjoint(step, Revolve(1000, 3), np.ones(4), np.ones(4))
    notes = "\n".join(info.value.__notes__)
    assert "the solver's forward step 977" in notes and "Advance(" in notes


class _FailingStore:
    """A dict store whose `method` fails for step `step`."""

    def __init__(self, method, step):
        self.held, self.method, self.step = {}, method, step

    def _maybe_fail(self, method, step):
        if method == self.method and step == self.step:
            raise OSError(f"{method} failed")

    def save(self, step, state, level=0):
        self._maybe_fail("save", step)
        self.held[step, level] = state.copy()

    def load(self, step, level=0, out=None, copy=True):
        self._maybe_fail("load", step)
        return self.held[step, level].copy()

    def delete(self, step, level=0):
        self._maybe_fail("delete", step)
        del self.held[step, level]

    def move(self, step, src, dst):
        self.held[step, dst] = self.held.pop((step, src))

    def wait(self):
        self._maybe_fail("wait", None)

    def stats(self):
        return None

    def close(self):
        pass


@pytest.mark.parametrize(
    "method, kind, words",
    [
        ("save", "Save", "saving u_{} on level 0"),
        ("load", "Load", "loading u_{} from level 0"),
        ("delete", "Delete", "deleting u_{} from level 0"),
    ],
)
def test_a_failing_store_call_is_named_with_the_action_the_machine_ran(method, kind, words):
    schedule = Revolve(30, 3)
    index, action = next(
        (i, a) for i, a in enumerate(schedule) if type(a).__name__ == kind and a.step > 0
    )
    with pytest.raises(OSError, match=f"{method} failed") as info:
        run_adjoint(
            _solver(), schedule, np.ones(6), lambda u: u, store=_FailingStore(method, action.step)
        )
    notes = "\n".join(info.value.__notes__)
    assert words.format(action.step) in notes
    assert f"(action {index} of the schedule: {action!r})" in notes


def test_a_failure_after_the_last_action_names_no_action():
    with pytest.raises(OSError, match="wait failed") as info:
        run_adjoint(
            _solver(), Revolve(12, 3), np.ones(6), lambda u: u, store=_FailingStore("wait", None)
        )
    notes = "\n".join(info.value.__notes__)
    assert "while flushing the store" in notes and "of the schedule" not in notes
