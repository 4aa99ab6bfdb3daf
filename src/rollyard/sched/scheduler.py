"""The scheduler's state machine: queue, placements, program views; the policy decides.

The shell calls ``submit`` / ``complete`` / ``cancel`` as requests come and go, feeds engine
measurements through ``update_engine``, and carries out what ``dispatch`` (starts and moves)
and ``tick`` (pauses and restores) return. Time comes only from the injected clock, so the
gateway, the tests and the simulator drive the same object.

During a dispatch or a tick the state indexes every engine's KV claims (``SchedState.claims``,
computed on first use and updated as programs are placed), so policies that weigh KV room for every
queued request cost O(programs + queue) per round instead of O(programs x queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rollyard.core.clock import Clock
from rollyard.core.errors import EngineUnavailable, InvalidRequest
from rollyard.core.program import ProgramPhase, ProgramState
from rollyard.sched.decisions import Move, Pause, Restore, Start
from rollyard.sched.fifo import AdmitAll, FifoOrder, LeastLoaded
from rollyard.sched.kv import reserve_tokens
from rollyard.sched.policy import Policy
from rollyard.sched.views import EngineView, ProgramView, Request, SchedState

__all__ = ["Scheduler"]

_GROUPS_KEPT = 4096  # group length estimates remembered (a run's groups in flight are far fewer)


class Scheduler:
    def __init__(self, clock: Clock, policy: Policy | None = None) -> None:
        self.clock = clock
        self.policy = policy or Policy("fifo", LeastLoaded(), AdmitAll(), FifoOrder())
        self.state = SchedState()
        self._open: dict[str, int] = {}  # program id -> requests queued or running
        self._lost: dict[str, str] = {}  # program id -> the dead engine it was unpinned from
        self._started: dict[str, float] = {}  # request id -> when it started (for service_s)
        self._freed = False  # a claim was dropped since the last admission pass (see admission_due)

    # engines --------------------------------------------------------------
    def add_engine(
        self, name: str, capacity: int = 256, kv_capacity_tokens: int = 0, role: str = "both"
    ) -> EngineView:
        """``role`` "prefill": known (health, fences) but never given a program (``EngineView.role``)."""
        if capacity < 1:
            raise InvalidRequest(f"engine {name!r}: capacity must be >= 1")
        view = self.state.engines[name] = EngineView(name, capacity, kv_capacity_tokens, role=role)
        return view

    def update_engine(
        self,
        name: str,
        *,
        kv_usage: float | None = None,
        kv_capacity_tokens: int | None = None,
        waiting: int | None = None,
        prefill_tok_s: float | None = None,
        decode_tok_s: float | None = None,
        healthy: bool | None = None,
    ) -> None:
        e = self.state.engines[name]
        if kv_usage is not None:
            e.kv_usage = kv_usage
        if kv_capacity_tokens:
            e.kv_capacity_tokens = kv_capacity_tokens
        if waiting is not None:
            e.waiting = waiting
        if prefill_tok_s:
            e.prefill_tok_s = prefill_tok_s
        if decode_tok_s:
            e.decode_tok_s = decode_tok_s
        if healthy is False and e.healthy:
            self.engine_down(name)
        elif healthy is not None:
            e.healthy = healthy

    def engine_down(self, name: str) -> list[str]:
        """Mark an engine dead and unpin its programs; returns the programs that will move."""
        self.state.engines[name].healthy = False
        moved = [p.id for p in self.state.programs.values() if p.engine == name]
        for pid in moved:
            self.state.programs[pid].engine = None
            self._lost[pid] = name
        return moved

    def healthy_engines(self) -> list[str]:
        """Engines that may serve a program now (prefill-only ones do not)."""
        return [e.name for e in self.state.healthy_engines()]

    def up_engines(self) -> list[str]:
        """Every healthy engine, prefill-only ones included (for health reports and fences)."""
        return [e.name for e in self.state.engines.values() if e.healthy]

    # programs -------------------------------------------------------------
    def register(
        self, program_id: str, group_id: str | None = None, group_size: int = 1, context_tokens: int = 0
    ) -> ProgramView:
        """Make a program known (idempotent; a request from an unknown program registers it)."""
        view = self.state.programs.get(program_id)
        if view is None:
            view = self.state.programs[program_id] = ProgramView(
                program_id, group_id, max(1, group_size), context_tokens=context_tokens
            )
            view.acting_since = self.clock.now()
        return view

    def observe(self, program_id: str, *, context_tokens: int) -> None:
        """The shell learned a program's context size (after a turn was recorded)."""
        view = self.state.programs.get(program_id)
        if view is not None:
            view.context_tokens = context_tokens

    def forget(self, program_id: str) -> None:
        """A program ended: it holds no placement and no longer counts toward any engine."""
        view = self.state.programs.pop(program_id, None)
        if view is not None:
            view.state = ProgramState.TERMINATED
            self._freed = True
        self._lost.pop(program_id, None)
        self._open.pop(program_id, None)

    # requests -------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        program_id: str,
        prompt_tokens: int = 0,
        max_tokens: int | None = None,
        chunk: int = 0,
    ) -> None:
        if not self.state.engines:
            raise EngineUnavailable("no engine is configured")
        now = self.clock.now()
        view = self.register(program_id)
        view.context_tokens = max(view.context_tokens, prompt_tokens)
        view.max_tokens = max_tokens
        if view.waiting_since is None:
            view.waiting_since = now
        self._opened(view)
        self.state.queue.append(Request(request_id, program_id, prompt_tokens, now, max_tokens, chunk))

    def cancel(self, request_id: str) -> None:
        """Drop a queued request (its client went away) or release a running one."""
        before = len(self.state.queue)
        dropped = [r for r in self.state.queue if r.request_id == request_id]
        if dropped:
            self.state.queue = deque(r for r in self.state.queue if r.request_id != request_id)
            self._closed(dropped[0].program_id)
        if len(self.state.queue) == before:
            self.complete(request_id)

    def complete(self, request_id: str, output_tokens: int | None = None, *, final: bool = True) -> None:
        """A running request ended (any way: done, error, disconnect). ``final=False``: a chunk
        of a divided request ended and its next chunk follows, so the program stays reasoning."""
        entry = self.state.running.pop(request_id, None)
        if entry is None:
            return
        request, engine = entry
        started = self._started.pop(request_id, None)
        view = self.state.engines.get(engine)
        if view is not None:
            view.in_flight -= 1
            if started is not None:
                ran = self.clock.now() - started
                view.service_s = ran if view.service_s <= 0 else 0.8 * view.service_s + 0.2 * ran
        program = self.state.programs.get(request.program_id)
        if program is not None and (final or program.paused):
            # a paused program claims KV only while its request runs; an active one that turns
            # acting may be paused to make room for an overdue one (its claim only grew)
            self._freed = True
        if program is not None and final:
            program.turns += 1
            if output_tokens is not None:
                program.output_lengths.append(output_tokens)
                if program.group_id is not None:
                    best = self.state.group_longest.get(program.group_id, 0)
                    self.state.group_longest[program.group_id] = max(best, output_tokens)
                    if len(self.state.group_longest) > _GROUPS_KEPT:  # oldest group first
                        del self.state.group_longest[next(iter(self.state.group_longest))]
        self._closed(request.program_id, keep_reasoning=not final)

    def dispatch(self) -> list[Start | Move]:
        """Start every queued request that may run and fits, in the policy's order."""
        if not self.state.queue:
            return []
        self.state.indexing, self.state.claims = True, None
        try:
            return self._dispatch()
        finally:
            self.state.indexing, self.state.claims = False, None

    def _dispatch(self) -> list[Start | Move]:
        now = self.clock.now()
        out: list[Start | Move] = []
        started: set[str] = set()
        router, order = self.policy.router, self.policy.order
        for r in order.order(self.state.queue, self.state, now):
            program = self.state.programs.get(r.program_id)
            if program is None or program.paused:
                continue  # held in the gateway until restored
            moved_from: str | None = None
            engine = program.engine
            if engine is None or not self.state.engines[engine].healthy:
                engine = router.place(program, self.state, now)
                if engine is None:
                    continue
                self._rehome(program, engine)
            else:
                move = router.reroute(program, r, self.state, now)
                if move is not None:
                    out.append(move)
                    moved_from, engine = engine, move.dst
                    self._rehome(program, engine)
            view = self.state.engines[engine]
            if view.free <= 0:
                continue  # sticky: wait for its own engine
            moved_from = moved_from or self._lost.pop(program.id, None)
            view.in_flight += 1
            self.state.running[r.request_id] = (r, engine)
            self._started[r.request_id] = now
            started.add(r.request_id)
            program.waiting_since = None
            prio = order.priority(r, self.state, now)
            out.append(Start(r.request_id, r.program_id, engine, moved_from, now - r.submitted_at, prio))
        if started:
            self.state.queue = deque(r for r in self.state.queue if r.request_id not in started)
        return out

    def tick(self) -> list[Pause | Restore]:
        """Ask the admission policy who runs now, apply its pauses and restores, return those applied."""
        return self._admit(self.policy.admission.tick)

    def admission_due(self) -> bool:
        """Whether KV just released may let a held request in: the policy restores on release,
        room may have appeared (a program ended, a paused program's request did, or a turn ended
        and its program, now acting, may be paused for an overdue one) and a queued request
        waits for a restore (its program paused or unplaced; idle paused programs wait for the
        tick). The shell asks after each request or program ends: a flag and a queue scan."""
        if not (self.policy.on_release and self._freed):
            return False
        programs = self.state.programs
        for r in self.state.queue:
            p = programs.get(r.program_id)
            if p is not None and (p.paused or p.engine is None):
                return True
        self._freed = False  # nobody to hand it to
        return False

    def admit(self) -> list[Pause | Restore]:
        """The admission policy's restore half (``Admission.restore``), applied like ``tick``."""
        return self._admit(self.policy.admission.restore)

    def _admit(self, decide: Callable[[SchedState, float], list[Pause | Restore]]) -> list[Pause | Restore]:
        self._freed = False  # this pass sees all the room there is
        now = self.clock.now()
        applied: list[Pause | Restore] = []
        self.state.indexing, self.state.claims = True, None
        try:
            decisions = decide(self.state, now)
        finally:
            self.state.indexing, self.state.claims = False, None
        for d in decisions:
            program = self.state.programs.get(d.program_id)
            if program is None or program.state.is_over:
                continue
            if isinstance(d, Pause):
                if program.paused:
                    continue
                program.state, program.paused_at = ProgramState.PAUSED, now
                program.pauses += 1
            else:
                target = self.state.engines.get(d.engine)
                if target is None or not target.healthy:
                    continue
                if program.engine is not None and program.engine != d.engine:
                    self._lost[program.id] = program.engine  # its next Start says where it came from
                program.state, program.paused_at, program.restored_at = ProgramState.ACTIVE, None, now
                program.engine = d.engine
            applied.append(d)
        return applied

    def _rehome(self, program: ProgramView, engine: str) -> None:
        """Place an active (unpaused) program on ``engine``, moving its claim in the KV index."""
        claims = self.state.claims
        if claims is not None and program.state is ProgramState.ACTIVE:
            claim = program.context_tokens + reserve_tokens(program, self.state.claims_buffer)
            if program.engine is not None:
                tokens, n = claims[program.engine]
                claims[program.engine] = (tokens - claim, n - 1)
            tokens, n = claims.get(engine, (0, 0))
            claims[engine] = (tokens + claim, n + 1)
        program.engine = engine

    # phase bookkeeping ----------------------------------------------------
    def _opened(self, view: ProgramView) -> None:
        self._open[view.id] = self._open.get(view.id, 0) + 1
        view.phase = ProgramPhase.REASONING

    def _closed(self, program_id: str, keep_reasoning: bool = False) -> None:
        n = self._open.get(program_id, 0) - 1
        view = self.state.programs.get(program_id)
        if n > 0:
            self._open[program_id] = n
            return
        self._open.pop(program_id, None)
        if view is not None and not keep_reasoning:
            view.phase, view.acting_since = ProgramPhase.ACTING, self.clock.now()
            if not any(r.program_id == program_id for r in self.state.queue):
                view.waiting_since = None
