"""The scheduling decision core: pure, clock-injected, importable without the gateway.

Views of programs and engines go in, decisions (start, pause, restore, move) come out; the
gateway's ``EnginePool`` and the simulator execute them.
"""

from rollyard.sched.decisions import Decision, Move, Pause, Restore, Start
from rollyard.sched.fifo import AdmitAll, FifoOrder, LeastLoaded
from rollyard.sched.kv import KvBudget
from rollyard.sched.policy import Admission, Order, Policy, Router
from rollyard.sched.registry import make_policy, policy_from_spec, policy_names
from rollyard.sched.rollyard import AgingAdmission, CostAware
from rollyard.sched.scheduler import Scheduler
from rollyard.sched.thunder import FewestTokens, ThunderAdmission
from rollyard.sched.views import EngineView, ProgramView, Request, SchedState

__all__ = [
    "Admission",
    "AdmitAll",
    "AgingAdmission",
    "CostAware",
    "Decision",
    "EngineView",
    "FewestTokens",
    "FifoOrder",
    "KvBudget",
    "LeastLoaded",
    "Move",
    "Order",
    "Pause",
    "Policy",
    "ProgramView",
    "Request",
    "Restore",
    "Router",
    "SchedState",
    "Scheduler",
    "Start",
    "ThunderAdmission",
    "make_policy",
    "policy_from_spec",
    "policy_names",
]
