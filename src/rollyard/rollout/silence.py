"""Stop a run whose agents never reach the model, with the agent's own error.

A program that ends without a single model turn teaches nothing, and its group is dropped and
replaced. When every program does that (a CLI that cannot start: missing binary, bad flag,
sandbox limit) the run would replace groups forever and print nothing. Programs whose environment
failed (their engine died, their sandbox broke) are left out: the engine's restart and the retries
handle those, and they say nothing about the agent. ``SilentPrograms`` counts
programs in a row that ended with no turn; past ``limit`` it names the last one's error (a
black-box CLI's exit status and stderr tail), which the training loop raises.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollyard.core.errors import AgentFailed
from rollyard.core.trajectory import Trajectory


def why_silent(t: Trajectory) -> str:
    """What a program that made no model turn said about it (its agent's error, else its status)."""
    details = t.outcome.details if t.outcome is not None else {}
    error = details.get("agent_error") or details.get("error")
    if error:
        return str(error)
    status = details.get("agent_status", t.outcome.status if t.outcome is not None else "unknown")
    return f"agent status {status!r}, no error output"


class SilentPrograms:
    """Consecutive programs (in the order they finished) that ended without a model turn."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streak = 0
        self.last = ""

    def observe(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            if t.num_turns > 0:
                self.streak = 0
            else:
                self.streak += 1
                self.last = why_silent(t)

    @property
    def tripped(self) -> bool:
        return self.streak >= self.limit

    def error(self) -> AgentFailed:
        return AgentFailed(
            f"{self.streak} programs in a row ended without a single model turn "
            f"(agent.max_silent_programs={self.limit}); the last one: {self.last}"
        )
