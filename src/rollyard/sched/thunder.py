"""ThunderAgent's program scheduling (arXiv 2602.13692), kept faithful for comparison.

Every tick: restore paused (and not yet placed) programs while they fit, reasoning ones
first, then new ones, then acting ones, smallest context first, each on the engine with the
most room (best-fit decreasing); then, on every engine whose programs claim more KV than
it has, pause acting programs smallest first, then reasoning ones, until it fits. New
programs go to the engine with the fewest active tokens, and wait while anyone is paused.
A program held longer than ``max_hold_s`` is restored regardless (their 1800 s timeout).
With a shared KV pool (``pool_load_tok_s`` > 0) a restore goes to the engine where it starts
soonest, its context's load from the pool charged off its own engine (``restore_engine``);
without one, ThunderAgent's choice (the most room) is kept.

Its known flaw is kept on purpose: smallest-first restore starves long contexts.
"""

from __future__ import annotations

from rollyard.core.program import ProgramPhase, ProgramState
from rollyard.sched.decisions import Move, Pause, Restore
from rollyard.sched.kv import KvBudget
from rollyard.sched.pool import RebuildCost, queue_delay_s
from rollyard.sched.views import EngineView, ProgramView, Request, SchedState

__all__ = ["FewestTokens", "ThunderAdmission", "held_s", "restore_candidates", "waits_for_restore"]


def held_s(p: ProgramView, now: float) -> float:
    """How long a program's pending request has been held back (0 when it has none)."""
    return now - p.waiting_since if p.waiting_since is not None else 0.0


def restore_candidates(state: SchedState) -> list[ProgramView]:
    """Paused programs, and programs with a waiting request that no engine took yet."""
    return [p for p in state.programs.values() if waits_for_restore(p)]


def _klass(p: ProgramView) -> int:
    """ThunderAgent's restore classes: reasoning (turn > 1), new, acting."""
    if p.turns == 0:
        return 1
    return 0 if p.phase is ProgramPhase.REASONING else 2


class ThunderAdmission:
    def __init__(
        self,
        budget: KvBudget | None = None,
        max_hold_s: float = 1800.0,
        acting_decay: bool = False,
        rebuild: RebuildCost | None = None,
    ) -> None:
        self.budget = budget or KvBudget()
        self.max_hold_s = max_hold_s
        self.acting_decay = acting_decay  # optimistic restore against decayed acting tokens
        self.rebuild = rebuild or RebuildCost()  # with a KV pool, restores weigh its load (restore_engine)

    # the parts a subclass changes ----------------------------------------
    def restore_order(self, candidates: list[ProgramView], now: float) -> list[ProgramView]:
        return sorted(candidates, key=lambda p: (_klass(p), p.context_tokens, p.id))

    def pause_order(self, victims: list[ProgramView], now: float) -> list[ProgramView]:
        acting = ProgramPhase.ACTING
        return sorted(victims, key=lambda p: (p.phase is not acting, p.context_tokens, p.id))

    def choose_engine(
        self, p: ProgramView, rooms: dict[str, float], engines: dict[str, EngineView]
    ) -> str | None:
        """The engine with the most room that fits the program (any engine: restores may move)."""
        need = self.budget.claim(p, 0.0)
        fits = [n for n, r in rooms.items() if r >= need]
        return max(fits, key=lambda n: (rooms[n], n)) if fits else None

    def restore_engine(
        self, p: ProgramView, rooms: dict[str, float], engines: dict[str, EngineView], state: SchedState
    ) -> str | None:
        """Where a restore lands. Without a KV pool: ``choose_engine``. With one, the context of a
        program restored off its engine loads instead of re-prefilling, so any engine that fits
        may take it: the cheapest, queue delay there (``queue_delay_s``) plus that load (none on
        its own engine, whose prefix cache may still hold it); ties go to the most room."""
        if not self.rebuild.pooled:
            return self.choose_engine(p, rooms, engines)
        need = self.budget.claim(p, 0.0)
        fits = [n for n, r in rooms.items() if r >= need]
        if not fits:
            return self.choose_engine(p, rooms, engines)  # the policy's own answer for a misfit

        def cost(n: str) -> float:
            load = 0.0 if n == p.engine else self.rebuild.seconds(p.context_tokens, engines[n])
            return queue_delay_s(engines[n], state) + load

        return min(fits, key=lambda n: (cost(n), -rooms[n], n))

    def stop_after_miss(self, p: ProgramView, now: float) -> bool:
        """Whether a candidate that does not fit blocks the ones behind it (no: skip it)."""
        return False

    def make_room(
        self, p: ProgramView, state: SchedState, rooms: dict[str, float], taken: set[str], now: float
    ) -> tuple[str, list[Pause]] | None:
        """Pauses that would let a candidate that does not fit run now (ThunderAgent: none)."""
        return None

    # the tick --------------------------------------------------------------
    def tick(self, state: SchedState, now: float) -> list[Pause | Restore]:
        out: list[Pause | Restore] = []
        healthy = {e.name: e for e in state.healthy_engines()}
        if not healthy:
            return out
        restored = self._restore(state, healthy, now, out)
        self._pause(state, healthy, now, restored, out)
        return out

    def restore(self, state: SchedState, now: float) -> list[Pause | Restore]:
        out: list[Pause | Restore] = []
        healthy = {e.name: e for e in state.healthy_engines()}
        if healthy:
            self._restore(state, healthy, now, out)
        return out

    def _restore(
        self, state: SchedState, healthy: dict[str, EngineView], now: float, out: list[Pause | Restore]
    ) -> dict[str, str]:
        rooms = {n: self.budget.room(state, e, now, self.acting_decay) for n, e in healthy.items()}
        restored: dict[str, str] = {}
        candidates = restore_candidates(state)
        forced = [p for p in candidates if held_s(p, now) >= self.max_hold_s]
        for p in forced:  # bounded hold: restore on the engine with the most room, fit or not
            name = max(rooms, key=lambda n: (rooms[n], n))
            self._take(p, name, rooms, now, restored, out)
        taken = set(restored)  # programs decided this tick (restored or paused), kept as we go
        for p in self.restore_order([p for p in candidates if p.id not in restored], now):
            name = self.restore_engine(p, rooms, healthy, state)
            if name is None:
                room = self.make_room(p, state, rooms, taken, now)
                if room is not None:
                    name, pauses = room
                    for v in pauses:
                        rooms[name] += self.budget.claim(state.programs[v.program_id], now, self.acting_decay)
                    out.extend(pauses)
                    taken.update(v.program_id for v in pauses)
                    self._take(p, name, rooms, now, restored, out)
                    taken.add(p.id)
                if self.stop_after_miss(p, now):
                    break
                continue
            self._take(p, name, rooms, now, restored, out)
            taken.add(p.id)
        return restored

    def _take(
        self,
        p: ProgramView,
        name: str,
        rooms: dict[str, float],
        now: float,
        restored: dict[str, str],
        out: list[Pause | Restore],
    ) -> None:
        rooms[name] -= self.budget.claim(p, now, self.acting_decay)
        restored[p.id] = name
        since = p.paused_at if p.paused_at is not None else p.waiting_since
        pooled = self.rebuild.pooled and p.engine is not None and p.engine != name  # loads its context
        out.append(Restore(p.id, name, now - since if since is not None else 0.0, pooled))

    def _pause(
        self,
        state: SchedState,
        healthy: dict[str, EngineView],
        now: float,
        restored: dict[str, str],
        out: list[Pause | Restore],
    ) -> None:
        paused = {d.program_id for d in out if isinstance(d, Pause)}
        by_engine: dict[str | None, list[ProgramView]] = {}  # one pass, not one per engine
        for p in state.programs.values():
            if (p.state is ProgramState.ACTIVE or p.id in restored) and p.id not in paused:
                by_engine.setdefault(restored.get(p.id, p.engine), []).append(p)
        for name, e in healthy.items():
            cap = self.budget.capacity(e)
            if not cap:
                continue
            mine = by_engine.get(name, [])
            over = sum(self.budget.claim(p, now) for p in mine) - cap
            for p in self.pause_order([p for p in mine if p.id not in restored], now):
                if over <= 0:
                    break
                over -= self.budget.claim(p, now)
                out.append(Pause(p.id, name))


def waits_for_restore(p: ProgramView) -> bool:
    """ThunderAgent's global waiting queue: paused programs and unplaced ones with a request."""
    return p.paused or (p.engine is None and p.waiting_since is not None and not p.state.is_over)


class FewestTokens:
    """New programs go to the engine with the fewest active tokens that has room for them;
    while a program is ahead of them in the waiting pool (paused, or unplaced and waiting
    since earlier) they wait for the admission tick, which serves the pool in its order.
    ``paused_block``: whether any paused program counts (ThunderAgent), or only one whose
    request is held."""

    def __init__(self, budget: KvBudget | None = None, paused_block: bool = True) -> None:
        self.budget = budget or KvBudget()
        self.paused_block = paused_block

    def _ahead(self, p: ProgramView, program: ProgramView) -> bool:
        if p.id == program.id or p.state.is_over:
            return False
        if p.paused:
            return self.paused_block or p.waiting_since is not None
        mine = program.waiting_since
        return (
            p.engine is None and p.waiting_since is not None and mine is not None and p.waiting_since < mine
        )

    def place(self, program: ProgramView, state: SchedState, now: float) -> str | None:
        if any(self._ahead(p, program) for p in state.programs.values()):
            return None
        need = self.budget.claim(program, now)
        ready = [e for e in state.engines.values() if e.free > 0 and self.budget.room(state, e, now) >= need]
        if not ready:
            return None
        return min(ready, key=lambda e: (self.budget.used(state, e.name, now), e.in_flight, e.name)).name

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        return None
