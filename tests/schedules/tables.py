"""Hand-written action tables shared by the tests of several subjects."""

from vlcc_adjoint.schedules import (
    Advance,
    Delete,
    Level,
    Load,
    Move,
    Reverse,
    Save,
    Schedule,
    actions_to_table,
)


def level0_moves() -> Schedule:
    """A table with every kind of level-0 action, Moves into and out of
    level 0 included."""
    actions = [
        Save(0, 0),
        Advance(0, 1),
        Save(1, 0),
        Move(0, 0, 1),
        Advance(1, 2),
        Save(2, 0),
        Move(2, 0, 1),
        Reverse(2),
        Move(2, 1, 0),
        Delete(2, 0),
        Load(1, 0),
        Reverse(1),
        Delete(1, 0),
        Move(0, 1, 0),
        Load(0, 0),
        Delete(0, 0),
        Reverse(0),
    ]
    return Schedule(actions_to_table(actions), 3, levels=[Level(2), Level(2)])


def moves_between_levels() -> Schedule:
    """Three steps over two levels of two slots, with Moves both ways (none of
    the schedule classes moves a record)."""
    actions = [
        Save(0, 1),
        Advance(0, 2),
        Save(2, 1),
        Reverse(2),
        Move(0, 1, 0),
        Move(2, 1, 0),
        Load(2, 0),
        Delete(2, 0),
        Move(0, 0, 1),
        Load(0, 1),
        Advance(0, 1),
        Reverse(1),
        Load(0, 1),
        Delete(0, 1),
        Reverse(0),
    ]
    return Schedule(actions_to_table(actions), 3, (Level(2), Level(2)))
