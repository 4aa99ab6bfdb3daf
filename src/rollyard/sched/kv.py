"""KV accounting shared by the pause/restore policies: how many cache tokens an engine's
programs claim, and how much room is left (ThunderAgent's capacity model).

A program claims its context plus a decode reserve: ``buffer_tokens``, or its request's
``max_tokens`` when that is smaller (a turn asked for 32 tokens cannot grow by 256; reserving the
full buffer for every program made the pausing policies see an 8-program, 2560-token cache as
full when a third of it was free). An acting program (its tool is running)
may be counted at a discount that halves every ``acting_half_life_s`` (ThunderAgent's 2^-t
decay: its KV is likely to be evicted soon, so restoring against it is optimistic). A paused
program still claims KV while a request it started before the pause is running (pausing is
soft: the gateway only holds its next request).

``claims_by_engine`` sums every engine's claims in one pass; during a dispatch or tick the
``Scheduler`` keeps that on the state (computed on the first ``used``, none for policies that
never ask), so a policy that asks for every candidate costs O(programs) per decision round,
not O(programs) per candidate and engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollyard.core.program import ProgramPhase, ProgramState
from rollyard.sched.views import EngineView, ProgramView, SchedState

__all__ = ["KvBudget", "claims_by_engine", "counts_on", "reserve_tokens"]


@dataclass(frozen=True)
class KvBudget:
    buffer_tokens: int = 256  # per program, for the tokens it is about to decode
    acting_half_life_s: float = 0.0  # 0: acting programs count in full
    # plan against at most this many KV tokens per engine (0: the engine's own capacity, from
    # vLLM's cache_config_info): headroom on an engine that also serves other traffic
    kv_tokens: int = 0

    def capacity(self, e: EngineView) -> int:
        """The KV tokens the policy may fill on ``e``; 0 while neither it nor the option is known."""
        if self.kv_tokens and e.kv_capacity_tokens:
            return min(self.kv_tokens, e.kv_capacity_tokens)
        return self.kv_tokens or e.kv_capacity_tokens

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
        return c + reserve_tokens(p, self.buffer_tokens)

    def used(self, state: SchedState, engine: str, now: float, decay: bool = False) -> float:
        """Tokens claimed on ``engine``: its active programs, plus paused ones still running there."""
        if state.indexing and not (decay and self.acting_half_life_s > 0):
            if state.claims is None or state.claims_buffer != self.buffer_tokens:
                state.claims = claims_by_engine(state, self.buffer_tokens)  # first question this round
                state.claims_buffer = self.buffer_tokens
            return float(state.claims.get(engine, (0, 0))[0])  # the scan's sum, exactly (integers)
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
        cap = self.capacity(e)
        if not cap:
            return float("inf")
        return cap - self.used(state, e.name, now, decay)


def counts_on(p: ProgramView, running: set[tuple[str, str]]) -> bool:
    """Whether a program claims KV on its engine (``running``: (program, engine) pairs in flight)."""
    if p.engine is None or p.state.is_over:
        return False
    return p.state is ProgramState.ACTIVE or (p.id, p.engine) in running


def reserve_tokens(p: ProgramView, buffer_tokens: int) -> int:
    """The decode room a program claims beyond its context."""
    return buffer_tokens if p.max_tokens is None else min(buffer_tokens, p.max_tokens)


def claims_by_engine(state: SchedState, buffer_tokens: int) -> dict[str, tuple[int, int]]:
    """Every engine's claimed (tokens, programs), in one pass over the programs; tokens are
    contexts plus decode reserves (``reserve_tokens``)."""
    running = {(r.program_id, e) for r, e in state.running.values()}
    out: dict[str, tuple[int, int]] = {}
    for p in state.programs.values():
        if counts_on(p, running):
            assert p.engine is not None
            tokens, n = out.get(p.engine, (0, 0))
            out[p.engine] = (tokens + p.context_tokens + reserve_tokens(p, buffer_tokens), n + 1)
    return out
