"""The cluster simulator: simulated vLLM engines and agent programs driving the live
``rollyard.sched`` policies under a fake clock (``rollyard sim WORKLOAD --policy NAME``)."""

from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.kv import BlockPool
from rollyard.sim.loop import Simulation
from rollyard.sim.profile import EngineProfile, load_profile, profile_names, save_profile
from rollyard.sim.result import SimResult
from rollyard.sim.workload import Workload, load_workload, workload_names

__all__ = [
    "BlockPool",
    "EngineProfile",
    "EngineRequest",
    "SimEngine",
    "SimResult",
    "Simulation",
    "Workload",
    "load_profile",
    "load_workload",
    "profile_names",
    "save_profile",
    "workload_names",
]
