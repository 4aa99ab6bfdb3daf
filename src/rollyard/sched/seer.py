"""Seer's context-aware group scheduling (arXiv 2511.14617), as composable sched parts.

The long tail of a synchronous rollout comes from a few long generations that start late or sit
behind short ones. Siblings of a GRPO group share a prompt, so their lengths correlate; Seer uses
that online:

- ``SeerOrder``: when a group starts, one of its requests runs first as the *probe* (highest
  priority; probes shortest-progress first, so estimates arrive early). A group's length estimate
  is the longest output any finished sibling produced, or the request's ``max_tokens`` while none
  has finished. The other requests are served longest-estimate first, so long generations start
  early instead of forming the tail. A starvation guard puts any request that waited more than
  ``starve_s`` ahead of everything (oldest first).
- ``SeerRouter``: least-loaded placement by requests in flight; a request whose engine is full
  moves to an engine with a free slot, and a divided request's next chunk moves to an engine
  running at least ``balance`` fewer requests than its own (counting itself there), when the
  re-prefill it pays there is cheap enough (``max_move_s``; with a shared KV pool,
  ``pool_load_tok_s`` > 0, the context loads at that rate instead). With ``balance`` 2 a move never
  leaves the destination busier than the source, so chunks do not ping-pong between engines.
- ``GroupBound``: the group-bound baseline Seer compares against: a group's programs all run
  on the engine its first program was placed on, and never move.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollyard.sched.decisions import Move
from rollyard.sched.pool import RebuildCost
from rollyard.sched.views import EngineView, ProgramView, Request, SchedState

__all__ = ["GroupBound", "SeerOrder", "SeerRouter"]

PROBE_PRIORITY, STARVED_PRIORITY, NORMAL_PRIORITY = 0, 0, 1
_UNBOUNDED = 1 << 30  # the estimate of a request with no max_tokens, before any sibling finished


def group_of(program: ProgramView | None, fallback: str) -> str:
    """Requests of a single program (no group, or a group of one) form their own group."""
    if program is None or program.group_id is None or program.group_size <= 1:
        return f"program:{fallback}"
    return program.group_id


class SeerOrder:
    """Probe first (shortest progress first), then longest group estimate first; starvation guard."""

    def __init__(self, starve_s: float = 30.0) -> None:
        if starve_s <= 0:
            raise ValueError("starve_s must be > 0")
        self.starve_s = starve_s
        self._probes: dict[str, str] = {}  # group -> its probe program, until the group has an estimate

    def estimate(self, request: Request, state: SchedState) -> int:
        """The group's longest finished output so far, else this request's max_tokens."""
        program = state.programs.get(request.program_id)
        done = state.group_longest.get(program.group_id) if program and program.group_id else None
        if done is not None and program is not None and program.group_size > 1:
            return done
        return request.max_tokens or _UNBOUNDED

    def is_probe(self, request: Request, state: SchedState) -> bool:
        program = state.programs.get(request.program_id)
        group = group_of(program, request.program_id)
        if program is None or program.group_size <= 1 or group in state.group_longest:
            self._probes.pop(group, None)
            return False
        return self._probes.get(group) == request.program_id

    def _designate(self, queue: Sequence[Request], state: SchedState) -> None:
        """A group seen for the first time gets its earliest queued request's program as probe."""
        live = {group_of(state.programs.get(pid), pid) for pid in state.programs}
        for stale in [g for g in self._probes if g not in live]:
            del self._probes[stale]
        running = [r.program_id for r, _ in state.running.values()]
        started = {group_of(state.programs.get(pid), pid) for pid in running}
        for r in queue:
            program = state.programs.get(r.program_id)
            if program is None or program.group_size <= 1 or program.group_id is None:
                continue
            g = program.group_id
            if g in self._probes or g in state.group_longest or g in started:
                continue
            self._probes[g] = r.program_id

    def order(self, queue: Sequence[Request], state: SchedState, now: float) -> list[Request]:
        self._designate(queue, state)

        def key(r: Request) -> tuple[Any, ...]:
            waited = now - r.submitted_at
            if waited > self.starve_s:
                return (0, -waited)
            if self.is_probe(r, state):
                return (1, r.chunk, r.prompt_tokens, r.submitted_at)
            return (2, -self.estimate(r, state), -r.chunk, r.submitted_at)

        return sorted(queue, key=key)

    def priority(self, request: Request, state: SchedState, now: float) -> int | None:
        if now - request.submitted_at > self.starve_s:
            return STARVED_PRIORITY
        return PROBE_PRIORITY if self.is_probe(request, state) else NORMAL_PRIORITY


def _least_busy(engines: list[EngineView]) -> EngineView | None:
    ready = [e for e in engines if e.free > 0]
    return min(ready, key=lambda e: (e.in_flight / e.capacity, e.kv_usage, e.name)) if ready else None


class SeerRouter:
    """Least busy placement; a request moves when its engine is full, or a divided request's
    next chunk when another engine runs ``balance`` fewer requests, if its re-prefill is cheap."""

    def __init__(
        self,
        max_move_s: float = 2.0,
        prefill_tok_s: float = 2000.0,
        balance: int = 2,
        pool_load_tok_s: float = 0.0,
    ) -> None:
        if max_move_s < 0 or balance < 1:
            raise ValueError("max_move_s must be >= 0 and balance >= 1")
        self.max_move_s, self.balance = max_move_s, balance
        self.rebuild = RebuildCost(prefill_tok_s, pool_load_tok_s)  # pool_load_tok_s 0: re-prefill

    def place(self, program: ProgramView, state: SchedState, now: float) -> str | None:
        best = _least_busy(state.healthy_engines())
        return best.name if best else None

    def move_cost_s(self, request: Request, dst: EngineView) -> float:
        """Seconds to rebuild the request's context on ``dst``: loaded from the shared KV pool
        (``engine.kv_pool``; the source engine stored it) when ``pool_load_tok_s`` is set, else
        re-prefilled at ``dst``'s measured rate (else the option)."""
        return self.rebuild.seconds(request.prompt_tokens, dst)

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        src = state.engines.get(program.engine or "")
        if src is None:
            return None
        dst = _least_busy([e for e in state.healthy_engines() if e.name != src.name])
        if dst is None or self.move_cost_s(request, dst) > self.max_move_s:
            return None
        if src.free <= 0:
            return Move(program.id, src.name, dst.name, "engine_full", self.rebuild.pooled)
        # a divided request's next chunk: it would run as one more of src's requests
        if request.chunk > 0 and (src.in_flight + 1) - dst.in_flight >= self.balance:
            return Move(program.id, src.name, dst.name, "balance", self.rebuild.pooled)
        return None


class GroupBound:
    """Seer's baseline: a group is bound to one engine (its first program's), FIFO within it."""

    def place(self, program: ProgramView, state: SchedState, now: float) -> str | None:
        if program.group_id is not None and program.group_size > 1:
            for p in state.programs.values():
                if p.id != program.id and p.group_id == program.group_id and p.engine is not None:
                    e = state.engines.get(p.engine)
                    if e is not None and e.healthy:
                        return e.name
        ready = state.healthy_engines()
        if not ready:
            return None
        groups: dict[str, set[str]] = {}
        for p in state.programs.values():
            if p.engine is not None and not p.state.is_over:
                groups.setdefault(p.engine, set()).add(p.group_id or p.id)
        return min(ready, key=lambda e: (len(groups.get(e.name, ())), e.in_flight, e.name)).name

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        return None
