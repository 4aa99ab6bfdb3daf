"""Black-box runner: unmodified CLI agents in a sandbox, pointed at their program's endpoint."""

from rollyard.agents.blackbox.profile import (
    OutputSource,
    RunnerProfile,
    TaskInput,
    load_profile,
    render,
    shipped_profiles,
)
from rollyard.agents.blackbox.runner import BlackBoxRunner, RunResult, free_port

__all__ = [
    "BlackBoxRunner",
    "OutputSource",
    "RunResult",
    "RunnerProfile",
    "TaskInput",
    "free_port",
    "load_profile",
    "render",
    "shipped_profiles",
]
