import pytest

from vlcc_adjoint.schedules import (InvalidScheduleError, Level, Multistage, Revolve,
                                    Schedule, Advance, Reverse, actions_to_table,
                                    binomial_forward_count)


def test_revolve_forward_count_is_binomial_optimum():
    for n in range(1, 400):
        for c in range(1, 25):
            assert Revolve(n, c).stats().forward_count == binomial_forward_count(n, c)


def test_multistage_one_free_level_equals_revolve():
    for n in (1, 2, 3, 10, 50):
        for c in (1, 2, 5):
            assert Multistage(n, [Level(c)]).stats().forward_count == binomial_forward_count(n, c)


def test_simulate_rejects_reverse_without_state():
    table = actions_to_table([Advance(0, 1), Reverse(0)])
    with pytest.raises(InvalidScheduleError):
        Schedule(table, 2).stats()


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_steps_is_value_error(bad):
    with pytest.raises(ValueError, match="steps"):
        Revolve(bad, 3)
