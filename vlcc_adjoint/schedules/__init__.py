"""Checkpoint schedules as data: pure planning, no I/O, no threads.

A schedule is a table of actions (:data:`ACTION_DTYPE`) that says, for a loop
of ``n`` steps and a storage hierarchy, which states to store where, what to
recompute and when each adjoint step runs.  :func:`simulate` checks and counts
a schedule; :func:`io_plan` derives its future reads for prefetch and
eviction; :func:`assign_slots` maps a level's records to the slots of a
fixed buffer; :class:`Machine` runs its rows against a client (the executor,
the torch and JAX integrations, a solver asking "what next?").
"""

from ._baselines import Periodic as Periodic
from ._baselines import StoreAll as StoreAll
from ._io_plan import IOPlan as IOPlan
from ._io_plan import LevelIO as LevelIO
from ._io_plan import io_plan as io_plan
from ._jit import load_kernels as load_kernels
from ._multistage import Multistage as Multistage
from ._online import Online as Online
from ._revolve import Revolve as Revolve
from ._revolve import binomial_forward_count as binomial_forward_count
from ._revolve import default_snapshots as default_snapshots
from ._schedule import Level as Level
from ._schedule import Schedule as Schedule
from ._simulate import InvalidScheduleError as InvalidScheduleError
from ._simulate import ScheduleStats as ScheduleStats
from ._simulate import simulate as simulate
from ._slots import SlotMap as SlotMap
from ._slots import assign_slots as assign_slots
from ._trace import Trace as Trace
from ._trace import table_trace as table_trace
from .actions import ACTION_DTYPE as ACTION_DTYPE
from .actions import ADVANCE as ADVANCE
from .actions import DELETE as DELETE
from .actions import LOAD as LOAD
from .actions import MOVE as MOVE
from .actions import REVERSE as REVERSE
from .actions import SAVE as SAVE
from .actions import Action as Action
from .actions import ActionKind as ActionKind
from .actions import Advance as Advance
from .actions import Delete as Delete
from .actions import Load as Load
from .actions import Move as Move
from .actions import Reverse as Reverse
from .actions import Save as Save
from .actions import actions_to_table as actions_to_table
from .actions import table_to_actions as table_to_actions
from .machine import ActionClient as ActionClient
from .machine import Machine as Machine
from .machine import perform as perform
