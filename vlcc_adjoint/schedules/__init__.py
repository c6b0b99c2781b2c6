from .actions import Advance, Save, Load, Delete, Move, Reverse, ActionKind, ACTION_DTYPE, actions_to_table
from ._schedule import Level, Schedule
from ._simulate import simulate, ScheduleStats, InvalidScheduleError
from ._revolve import Revolve, binomial_forward_count
from ._multistage import Multistage
