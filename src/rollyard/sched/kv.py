"""KV accounting shared by the pause/restore policies: how many cache tokens an engine's
programs claim, and how much room is left (ThunderAgent's capacity model).

A program claims its context plus a decode buffer. An acting program (its tool is running)
may be counted at a discount that halves every ``acting_half_life_s`` (ThunderAgent's 2^-t
decay: its KV is likely to be evicted soon, so restoring against it is optimistic). A paused
program still claims KV while a request it started before the pause is running (pausing is
soft: the gateway only holds its next request).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollyard.core.program import ProgramPhase, ProgramState
from rollyard.sched.views import EngineView, ProgramView, SchedState

__all__ = ["KvBudget"]


@dataclass(frozen=True)
class KvBudget:
    buffer_tokens: int = 256  # per program, for the tokens it is about to decode
    acting_half_life_s: float = 0.0  # 0: acting programs count in full

    def claim(self, p: ProgramView, now: float, decay: bool = False) -> float:
        """KV tokens one program claims on its engine."""
        c = float(p.context_tokens)
        if (
            decay
            and self.acting_half_life_s > 0
            and p.phase is ProgramPhase.ACTING
            and p.acting_since is not None
        ):
            c *= 2.0 ** (-(now - p.acting_since) / self.acting_half_life_s)
        return c + self.buffer_tokens

    def used(self, state: SchedState, engine: str, now: float, decay: bool = False) -> float:
        """Tokens claimed on ``engine``: its active programs, plus paused ones still running there."""
        running = {r.program_id for r, e in state.running.values() if e == engine}
        total = 0.0
        for p in state.programs.values():
            if p.engine != engine or p.state.is_over:
                continue
            if p.state is ProgramState.ACTIVE or p.id in running:
                total += self.claim(p, now, decay)
        return total

    def room(self, state: SchedState, e: EngineView, now: float, decay: bool = False) -> float:
        """Free KV tokens on an engine; infinite while its capacity is not known yet."""
        if not e.kv_capacity_tokens:
            return float("inf")
        return e.kv_capacity_tokens - self.used(state, e.name, now, decay)
