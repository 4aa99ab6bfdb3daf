"""The discrete-event loop: simulated engines and agent programs around the live ``Scheduler``.

The simulator is the gateway's ``EnginePool`` with the network taken out: a turn is
``Scheduler.submit``; every ``Start`` that ``dispatch`` returns puts the request on its engine;
a finished request is ``complete`` then ``observe`` (the context the turn reached); the
admission policy's ``tick`` runs every ``policy.tick_s`` (and its restore half, ``admit``, after
a request ends, for policies that restore on release) and engine stats are fed through
``update_engine`` every ``poll_s``, as the gateway polls vLLM's ``/metrics``. Only the clock
is fake, so a policy object behaves here exactly as it does behind the gateway.

With the profile's cost sections (``sim.costs``), a request also queues for a gateway core on
its way in and on its way back (``sim.gateway``), and each trainer step and publication takes
its time, the engines fenced while they take the weights (``sim.trainer``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from rollyard.core.clock import FakeClock
from rollyard.core.errors import ConfigError
from rollyard.sched import Move, Policy, Scheduler, Start
from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.gateway import GatewayQueue
from rollyard.sim.kv import SharedPool
from rollyard.sim.periodic import (
    ARRIVE,
    FAIL,
    FENCE,
    GATEWAY,
    KICK,
    POLL,
    PUBLISHED,
    RECOVER,
    STEP,
    SUBMIT,
    TICK,
    TRAINED,
    PeriodicWork,
)
from rollyard.sim.profile import EngineProfile
from rollyard.sim.result import SimResult
from rollyard.sim.stats import SimStats
from rollyard.sim.trainer import SimTrainer
from rollyard.sim.workload import ProgramPlan, RLMode, Workload

__all__ = ["Simulation"]

STALL_S = 86400.0  # simulated time with only polls and ticks after which a run is declared stuck


@dataclass
class _Program:
    plan: ProgramPlan
    turn: int = 0
    attempt: int = 0
    started: float = 0.0
    submitted: float = 0.0  # the current turn's first submit
    outputs: int = 0
    turn_out: int = 0  # tokens of the current turn generated so far (divided rollout: earlier chunks)
    chunk: int = 0
    ask: tuple[int, int] = (0, 0)  # the request in flight: (prompt tokens, max tokens)


class Simulation(PeriodicWork):
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        profile: EngineProfile,
        *,
        record: bool = False,
        plans: list[ProgramPlan] | None = None,
        shell_up_s: float = 0.0,
        kv_pool: bool = False,
    ) -> None:
        """``plans`` replaces the workload's drawn programs (a trace recorded from a live run).

        ``shell_up_s``: how long the gateway had been up when the run started (a live trace's).
        The gateway polls its engines from the moment it is up and ticks the policy every
        ``tick_s`` after that, so a replay puts its first poll and tick where the live ones
        fell: with thunder's 5 s tick, a phase off by a few seconds decides which of a 12 s
        run's two ticks see the engine over capacity.

        ``kv_pool``: the engines share a KV pool (``SharedPool``), charged at the profile's
        ``pool_bytes_per_s``; the policy learns its rate from its ``pool_load_tok_s`` option."""
        if workload.max_context > profile.max_model_len:
            raise ConfigError(
                f"workload max_context {workload.max_context} exceeds the profile's max_model_len "
                f"{profile.max_model_len}"
            )
        self.workload, self.policy, self.profile = workload, policy, profile
        self.shell_up_s = shell_up_s
        self.clock = FakeClock()
        self.sched = Scheduler(self.clock, policy)
        if kv_pool and not profile.pool_load_tok_s:
            raise ConfigError(
                f"profile {profile.name} has no KV pool terms (kv_bytes_per_token, pool_bytes_per_s)"
            )
        pool = SharedPool(profile.block_size) if kv_pool else None
        self.engines: dict[str, SimEngine] = {}
        for i in range(workload.engines):
            name = f"e{i}"
            self.engines[name] = SimEngine(name, profile, pool)
            self.sched.add_engine(name, workload.gateway_capacity, profile.kv_tokens)
        self.stats = SimStats()
        self.record = record
        self.decisions: list[tuple[float, Any]] = []
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = itertools.count()
        self._programs: dict[str, _Program] = {}
        self._running: dict[str, tuple[str, str]] = {}  # request id -> (program, engine)
        groups: dict[str, list[ProgramPlan]] = {}
        plans = plans if plans is not None else workload.plans()
        for plan in plans:
            groups.setdefault(plan.group_id, []).append(plan)
        self._pending: deque[list[ProgramPlan]] = deque(groups.values())
        self._live = 0  # programs started and not finished
        self._done = 0
        self._total = len(plans)
        self.trainer = SimTrainer(
            workload.rl, profile, self.clock, self.stats, lambda s: self._at(self.clock.now() + s, TRAINED)
        )
        self.gateway = GatewayQueue(profile.gateway) if profile.gateway else None
        self._step_groups: set[str] = set()
        self._prefill_seen: dict[str, tuple[int, float]] = {}  # sync mode: the groups of the step under way

    # ---- events ------------------------------------------------------------------------------
    def _at(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, a, b))

    def run(self) -> SimResult:
        wall = time.perf_counter()
        self._launch()
        if self.policy.tick_s:
            self._at(self._phase(self.policy.tick_s, first=1), TICK)
        first_poll = self._phase(self.workload.poll_s, first=0)  # and one at 0: what it saw last
        self._at(0.0, POLL, first_poll if first_poll > 0 else None)
        for f in self.workload.failures:
            self._at(f.at_s, FAIL, f"e{f.engine}", f.down_s)
        events, progress = 0, 0.0
        while self._heap and self._done < self._total:
            t, _, kind, a, b = heapq.heappop(self._heap)
            self.clock.advance(max(0.0, t - self.clock.now()))  # now + (t - now) can pass t by an ulp
            events += 1
            if kind not in (POLL, TICK):
                progress = t
            elif t - progress > STALL_S:
                break  # only the periodic events are left: nothing will ever finish
            if kind == STEP:
                if not self._on_step(a, b):
                    continue  # nothing ended: no start can have become possible
                self._admit_if_due()  # as the gateway's EnginePool.release / forget do
            elif kind == SUBMIT:
                self._request(a)
            elif kind == TICK:
                self._on_tick()
            elif kind == POLL:
                self._on_poll(a)
            elif kind == FAIL:
                self._on_fail(a, b)
            elif kind == RECOVER:
                self._on_recover(a)
            elif kind == TRAINED:
                self._on_trained()
            elif kind == FENCE:
                self._on_fence()
            elif kind == PUBLISHED:
                self._on_published()
            elif kind == GATEWAY:
                self._on_gateway(a, b)
            elif kind == ARRIVE:
                self._arrive(a, b)
                continue
            elif kind == KICK:
                self._kick(a)
                continue
            self._pump()
        if self._done < self._total:
            raise RuntimeError(f"simulation stalled with {self._total - self._done} programs unfinished")
        makespan = self.clock.now()
        summary = self.stats.summary(makespan, list(self.engines.values()))
        if self.gateway is not None:
            summary |= self.gateway.summary(makespan)
        summary["events"] = events
        summary["wall_s"] = time.perf_counter() - wall
        return SimResult(
            self.workload.name,
            self.policy.name,
            self.profile.name,
            len(self.engines),
            summary,
            self.stats,
            self.decisions,
        )

    def _phase(self, period: float, first: int) -> float:
        """The first of the shell's periodic events (at up + ``period`` x k, k >= ``first``)
        that falls at or after the run's start, on the run's clock."""
        k = max(first, math.ceil(self.shell_up_s / period - 1e-9))
        return k * period - self.shell_up_s

    # ---- programs ----------------------------------------------------------------------------
    def _launch(self) -> None:
        """Start groups: while the concurrency allows (serving, async RL), or a step's worth (sync)."""
        w = self.workload
        if w.rl.mode is RLMode.SYNC:
            if self._step_groups or self.trainer.busy:
                return
            for _ in range(min(w.rl.batch_groups, len(self._pending))):
                group = self._pending.popleft()
                self._step_groups.add(group[0].group_id)
                self._start_group(group)
            return
        limit = w.concurrency or self._total
        while self._pending and self._live + len(self._pending[0]) <= limit:
            self._start_group(self._pending.popleft())

    def _start_group(self, group: list[ProgramPlan]) -> None:
        now = self.clock.now()
        for plan in group:
            self._live += 1
            self._programs[plan.id] = _Program(plan, started=now)
            self.sched.register(plan.id, plan.group_id, plan.group_size, plan.turns[0].prompt_tokens)
            if self.workload.rl.mode is not RLMode.NONE:
                version = self.trainer.version
                self.trainer.buffer.submit(
                    plan.id, group_id=plan.group_id, group_size=plan.group_size, policy_version=version
                )
            if plan.start_s > now:  # a live trace's program whose first request came later
                self._at(plan.start_s, SUBMIT, plan.id)
            else:
                self._request(plan.id)

    def _request(self, pid: str) -> None:
        """The client sends its turn (or retries it): through a gateway core when the gateway
        costs CPU, then to the scheduler."""
        p = self._programs[pid]
        if p.turn_out:  # a divided turn's lost chunk: the gateway retries it itself
            self._submit(pid)
            return
        p.submitted = self.clock.now()
        if self.gateway is None:
            self._submit(pid)
            return
        cost = self.gateway.cost.in_s(p.plan.turns[p.turn].prompt_tokens, p.plan.new_tokens(p.turn))
        self._via_gateway(pid, cost, ("in", pid))

    def _via_gateway(self, pid: str, service_s: float, job: tuple[str, str]) -> None:
        assert self.gateway is not None
        shard = self.gateway.shard_of(pid)
        end = self.gateway.offer(shard, self.clock.now(), service_s, job)
        if end is not None:
            self._at(end, GATEWAY, shard, job)

    def _on_gateway(self, shard: int, job: tuple[str, str]) -> None:
        """A gateway core finished a job: the request goes on (to the scheduler, or to its
        client), and the core takes the shard's next waiting job."""
        assert self.gateway is not None
        nxt = self.gateway.release(shard, self.clock.now())
        if nxt is not None:
            self._at(nxt[0], GATEWAY, shard, nxt[1])
        way, pid = job
        if way == "in":
            self._submit(pid)
        else:
            self._answered(self._programs[pid], self.clock.now())

    def _submit(self, pid: str) -> None:
        """Submit the program's next request: its turn, or under divided rollout (``divide_tokens``,
        the gateway's ``--divide-tokens``) the turn's next chunk, which continues the last one."""
        p = self._programs[pid]
        turn = p.plan.turns[p.turn]
        rid = f"{pid}.{p.turn}.{p.chunk}.{p.attempt}"
        left = turn.output_tokens - p.turn_out
        divide = self.workload.divide_tokens
        p.ask = (turn.prompt_tokens + p.turn_out, min(left, divide) if divide else left)
        self.sched.submit(rid, pid, p.ask[0], p.ask[1], p.chunk)

    def _pump(self) -> None:
        """Carry out ``dispatch`` as the gateway's ``EnginePool._pump`` does."""
        now = self.clock.now()
        for d in self.sched.dispatch():
            if self.record:
                self.decisions.append((now, d))
            if isinstance(d, Move):
                self.stats.moves += 1
                continue
            assert isinstance(d, Start)
            p = self._programs[d.program_id]
            engine = self.engines[d.engine]
            self._running[d.request_id] = (d.program_id, d.engine)
            self.stats.queue_wait.append(d.waited_s)
            req = EngineRequest(d.request_id, d.program_id, p.ask[0], p.ask[1], now)
            if p.plan.group_size > 1:  # its context starts with the group's task prompt
                req.shared_key, req.shared_tokens = p.plan.group_id, p.plan.turns[0].prompt_tokens
            self._at(now + self.profile.request_s, ARRIVE, engine, req)

    def _arrive(self, engine: SimEngine, req: EngineRequest) -> None:
        """A started request reaches its engine (``request_s`` after the Start: the HTTP hop)."""
        now = self.clock.now()
        if not engine.healthy:
            self._lost(engine, [req])
            return
        req.arrived = now
        end = engine.add(req, now)
        if end is not None:
            self._at(end, STEP, engine.name, engine.version)
        elif engine.run is None:
            self._at(now, KICK, engine)  # after every arrival of this instant: they share a step

    def _kick(self, engine: SimEngine) -> None:
        if engine.run is None and engine.healthy:
            end = engine.plan(self.clock.now())
            if end is not None:
                self._at(end, STEP, engine.name, engine.version)

    def _on_step(self, name: str, version: int) -> bool:
        """Apply an engine step that ended; True when a request finished."""
        engine = self.engines[name]
        if version != engine.version or engine.run is None:
            return False  # replaced by a shortened run, or the engine died
        now = self.clock.now()
        finished = engine.finish(now)
        end = engine.plan(now)
        if end is not None:
            self._at(end, STEP, name, engine.version)
        for r in finished:
            self._finished(r, now)
        return bool(finished)

    def _finished(self, r: EngineRequest, now: float) -> None:
        self._running.pop(r.request_id, None)
        p = self._programs[r.program_id]
        turn = p.plan.turns[p.turn]
        if p.turn_out == 0 and r.first_token_at is not None:
            self.stats.ttft.append(r.first_token_at - p.submitted)
        p.turn_out += r.generated
        self.stats.output_tokens += r.generated
        p.outputs += r.generated
        p.attempt = 0
        if p.turn_out < turn.output_tokens:  # a divided turn's chunk: the next one follows at once
            self.sched.complete(r.request_id, r.generated, final=False)
            p.chunk += 1
            self._submit(r.program_id)
            return
        self.sched.complete(r.request_id, p.turn_out)
        self.sched.observe(r.program_id, context_tokens=turn.prompt_tokens + p.turn_out)
        if self.gateway is None:
            self._answered(p, now)
        else:  # the answer passes a gateway core on its way back to the client
            self._via_gateway(r.program_id, self.gateway.cost.out_s(p.turn_out), ("out", r.program_id))

    def _answered(self, p: _Program, now: float) -> None:
        """The turn's answer reached its client: the tool call, then the next turn, or the end."""
        turn = p.plan.turns[p.turn]
        self.stats.request_latency.append(now - p.submitted)
        p.turn += 1
        p.turn_out = p.chunk = 0
        if p.turn < len(p.plan.turns):
            self._at(now + turn.tool_s, SUBMIT, p.plan.id)
            return
        self._program_done(p, now)

    def _program_done(self, p: _Program, now: float) -> None:
        self.sched.forget(p.plan.id)
        self._live -= 1
        self._done += 1
        self.stats.program_latency.append(now - p.started)
        self.stats.program_end.append(now)
        mode = self.workload.rl.mode
        if mode is not RLMode.NONE:
            last = p.plan.turns[-1]
            unit = p.plan.group_id if p.plan.group_size > 1 else p.plan.id
            task = p.plan.turns[0].prompt_tokens if p.plan.group_size > 1 else 0
            self.trainer.finished(p.plan.id, unit, task, last.prompt_tokens + last.output_tokens)
        if mode is RLMode.SYNC:
            gid = p.plan.group_id
            if gid in self._step_groups and not any(
                q.plan.group_id == gid and q.turn < len(q.plan.turns) for q in self._programs.values()
            ):
                self._step_groups.discard(gid)
        del self._programs[p.plan.id]
        if mode is not RLMode.NONE:
            self._train()
        self._launch()

    # ---- the trainer and publication -------------------------------------------------------------
    def _train(self) -> None:
        step_over = not self._step_groups
        self.trainer.take(step_over, self._done >= self._total)

    def _on_trained(self) -> None:
        """A step ended: stage the weights, then fence every engine while it takes them."""
        stage, fence = self.trainer.publish_costs(len(self.engines))
        now = self.clock.now()
        if fence:
            self._at(now + stage, FENCE)
        self._at(now + stage + fence, PUBLISHED)

    def _on_fence(self) -> None:
        """Engines stop scheduling (the step under way ends first) until the weights are in."""
        now = self.clock.now()
        for e in self.engines.values():
            end = e.fence(now)
            if end is not None:
                self._at(end, STEP, e.name, e.version)

    def _on_published(self) -> None:
        for e in self.engines.values():
            if e.fenced:
                e.fenced = False
                self._kick(e)
        self.trainer.published()
        self._train()
        self._launch()
