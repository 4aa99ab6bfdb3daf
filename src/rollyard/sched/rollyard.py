"""rollyard's program scheduling: ThunderAgent's pause/restore without its starvation, plus
cost-aware routing.

- ``AgingAdmission``: restore order ages with waiting time (a program's effective size is its
  context divided by ``1 + held / age_s``); a program held past its reserve time goes to
  the front, oldest first, and while it does not fit nobody behind it takes the room it
  needs, and acting programs on an engine are paused to make it room; no request is held
  longer than ``max_hold_s`` (default 30 s). A restored program
  returns to the engine that has its prefix cached when it fits there. Recently restored
  programs are paused last. Restores also run the moment KV is released (a request or a
  program ends: ``Policy.on_release``), not only every tick.
  Both times follow the engines' measured request time (``EngineView.service_s``): the
  reserve time is ``max(reserve_after_s, reserve_after_turns x request time)`` and "recent"
  is ``max(min_run_s, min_run_turns x request time)``. With fixed seconds, a slow engine
  (a request of 10-15 s on 2 loaded cores) made every held program overdue within one
  request and paused programs right after restoring them, so their cached prefixes were
  evicted and recomputed: ``bench programs`` measured 10.8 turns/min with 5 s / 5 s and 22.0
  with 15 s / 30 s, prefix-cache hit rate 0.19 vs 0.47 (docs/scheduling.md).
- ``CostAware``: a sticky program leaves its engine only when the expected queue delay there
  exceeds the re-prefill of its whole context on the other engine (at that engine's measured
  prefill tokens/s; with a shared KV pool, its load at ``pool_load_tok_s``: ``sched.pool``) plus
  the other engine's own delay (Forge's cache-transfer trade-off).

Requests are ordered FIFO. vLLM's per-request ``priority`` is not used yet: it needs the engine
started with ``--scheduling-policy priority`` and a measurement that it helps.
"""

from __future__ import annotations

from rollyard.core.program import ProgramPhase, ProgramState
from rollyard.sched.decisions import Move, Pause, Restore
from rollyard.sched.kv import KvBudget
from rollyard.sched.pool import RebuildCost, queue_delay_s
from rollyard.sched.thunder import FewestTokens, ThunderAdmission, held_s
from rollyard.sched.views import EngineView, ProgramView, Request, SchedState

__all__ = ["AgingAdmission", "CostAware", "queue_delay_s"]


class AgingAdmission(ThunderAdmission):
    def __init__(
        self,
        budget: KvBudget | None = None,
        max_hold_s: float = 30.0,
        age_s: float = 2.0,
        reserve_after_s: float | None = None,
        min_run_s: float = 5.0,
        acting_decay: bool = False,
        reserve_after_turns: float = 1.0,
        min_run_turns: float = 2.0,
        rebuild: RebuildCost | None = None,
    ) -> None:
        super().__init__(budget, max_hold_s, acting_decay, rebuild)
        self.age_s = age_s
        self.reserve_after_s = min(5.0, max_hold_s / 3) if reserve_after_s is None else reserve_after_s
        self.min_run_s = min_run_s
        self.reserve_after_turns, self.min_run_turns = reserve_after_turns, min_run_turns
        self._turn_s = 0.0  # the slowest healthy engine's request time, read at each tick

    def tick(self, state: SchedState, now: float) -> list[Pause | Restore]:
        self._turn_s = max((e.service_s for e in state.healthy_engines()), default=0.0)
        return super().tick(state, now)

    def restore(self, state: SchedState, now: float) -> list[Pause | Restore]:
        self._turn_s = max((e.service_s for e in state.healthy_engines()), default=0.0)
        return super().restore(state, now)

    @property
    def reserve_s(self) -> float:
        """How long a held program waits before it goes to the front (at most ``max_hold_s``)."""
        return min(self.max_hold_s, max(self.reserve_after_s, self.reserve_after_turns * self._turn_s))

    @property
    def fresh_s(self) -> float:
        """How long a restored program counts as recently restored (paused last)."""
        return max(self.min_run_s, self.min_run_turns * self._turn_s)

    def restore_order(self, candidates: list[ProgramView], now: float) -> list[ProgramView]:
        reserve = self.reserve_s

        def key(p: ProgramView) -> tuple[int, float, float, str]:
            held = held_s(p, now)
            if held >= reserve:
                return (0, -held, 0.0, p.id)  # overdue: oldest first, and it blocks the rest
            waiting = p.waiting_since is not None  # a request is held: it matters now
            return (1, 0.0 if waiting else 1.0, p.context_tokens / (1.0 + held / self.age_s), p.id)

        return sorted(candidates, key=key)

    def stop_after_miss(self, p: ProgramView, now: float) -> bool:
        return held_s(p, now) >= self.reserve_s

    def make_room(
        self, p: ProgramView, state: SchedState, rooms: dict[str, float], taken: set[str], now: float
    ) -> tuple[str, list[Pause]] | None:
        """An overdue program that does not fit: pause acting programs (their tools are running,
        nothing of theirs is in flight) on the engine where that frees room soonest."""
        if held_s(p, now) < self.reserve_s:
            return None
        need = self.budget.claim(p, now)
        running = {r.program_id for r, _ in state.running.values()}
        idle_on: dict[str | None, list[ProgramView]] = {}  # one pass, not one per engine
        for q in state.programs.values():
            if (
                q.state is ProgramState.ACTIVE
                and q.phase is ProgramPhase.ACTING
                and q.id not in running
                and q.id not in taken
            ):
                idle_on.setdefault(q.engine, []).append(q)
        best: tuple[int, str, list[Pause]] | None = None
        for name, room in rooms.items():
            idle = idle_on.get(name, [])
            pauses: list[Pause] = []
            for q in self.pause_order(idle, now):
                if room >= need:
                    break
                room += self.budget.claim(q, now, self.acting_decay)
                pauses.append(Pause(q.id, name, "make_room"))
            if room >= need and (best is None or len(pauses) < best[0]):
                best = (len(pauses), name, pauses)
        return None if best is None else (best[1], best[2])

    def pause_order(self, victims: list[ProgramView], now: float) -> list[ProgramView]:
        recent = self.fresh_s

        def key(p: ProgramView) -> tuple[bool, bool, int, str]:
            fresh = p.restored_at is not None and now - p.restored_at < recent
            return (fresh, p.phase is not ProgramPhase.ACTING, p.context_tokens, p.id)

        return sorted(victims, key=key)

    def choose_engine(
        self, p: ProgramView, rooms: dict[str, float], engines: dict[str, EngineView]
    ) -> str | None:
        need = self.budget.claim(p, 0.0)
        if p.engine in rooms and rooms[p.engine] >= need:
            return p.engine  # its prefix is cached there
        chosen = super().choose_engine(p, rooms, engines)
        if chosen is None and all(need > self.budget.capacity(e) > 0 for e in engines.values()):
            return max(rooms, key=lambda n: (rooms[n], n))  # fits nowhere ever: do not hold it for nothing
        return chosen


class CostAware(FewestTokens):
    def __init__(
        self, budget: KvBudget | None = None, margin: float = 1.0, rebuild: RebuildCost | None = None
    ) -> None:
        super().__init__(budget, paused_block=False)  # idle paused programs do not hold newcomers back
        self.margin = margin
        self.rebuild = rebuild or RebuildCost()

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        src = state.engines.get(program.engine or "")
        if src is None:
            return None
        stay = queue_delay_s(src, state)
        if stay <= 0:
            return None
        need = self.budget.claim(program, now)
        best: tuple[float, str] | None = None
        for e in state.healthy_engines():
            if e.name == src.name or not self.rebuild.known(e) or e.free <= 0:
                continue
            if self.budget.room(state, e, now) < need:
                continue
            cost = self.rebuild.seconds(program.context_tokens, e) + queue_delay_s(e, state)
            if best is None or cost < best[0]:
                best = (cost, e.name)
        if best is None or stay <= best[0] * self.margin:
            return None
        how = "pool load" if self.rebuild.pooled else "re-prefill"
        why = f"queue {stay:.2f}s > {how} {best[0]:.2f}s"
        return Move(program.id, src.name, best[1], why, self.rebuild.pooled)
