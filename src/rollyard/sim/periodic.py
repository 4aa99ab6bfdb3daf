"""The gateway's periodic work and engine failures, as the simulation's shell does them.

A mixin of ``sim.loop.Simulation`` (split from it along this seam): the policy's ``tick``
every ``tick_s``, the engine-stats poll every ``poll_s`` (``update_engine``, as the gateway
polls vLLM's ``/metrics``), and whole-engine failures whose requests error out to clients that
retry. The event kinds live here, the loop dispatches them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rollyard.sched import Pause, Policy, Restore, Scheduler
from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.stats import SimStats
from rollyard.sim.workload import Workload

__all__ = ["EVENTS", "PeriodicWork"]

EVENTS = STEP, SUBMIT, TICK, POLL, FAIL, RECOVER, TRAINED, ARRIVE, KICK, GATEWAY, FENCE, PUBLISHED = range(12)


class PeriodicWork:
    """Ticks, polls and failures; the state they touch is the simulation's."""

    sched: Scheduler
    policy: Policy
    workload: Workload
    stats: SimStats
    engines: dict[str, SimEngine]
    record: bool
    decisions: list[tuple[float, Any]]
    _live: int
    _programs: dict[str, Any]
    _running: dict[str, tuple[str, str]]
    _prefill_seen: dict[str, tuple[int, float]]
    _at: Callable[..., None]
    clock: Any

    def _on_tick(self) -> None:
        self._count(self.sched.tick())
        assert self.policy.tick_s
        self._at(self.clock.now() + self.policy.tick_s, TICK)

    def _admit_if_due(self) -> None:
        if self.sched.admission_due():
            self._count(self.sched.admit())

    def _count(self, decisions: list[Pause | Restore]) -> None:
        now = self.clock.now()
        for d in decisions:
            if self.record:
                self.decisions.append((now, d))
            if isinstance(d, Pause):
                self.stats.pauses += 1
            elif isinstance(d, Restore):
                self.stats.hold_s.append(d.held_s)

    def _on_poll(self, next_at: float | None = None) -> None:
        now = self.clock.now()
        usages = []
        for name, e in self.engines.items():
            if e.healthy:
                usages.append(e.kv.usage)
                self.sched.update_engine(
                    name, kv_usage=e.kv.usage, waiting=len(e.waiting), prefill_tok_s=self._prefill_rate(e)
                )
        paused = sum(1 for v in self.sched.state.programs.values() if v.paused)
        mean = sum(usages) / len(usages) if usages else 0.0
        self.stats.series.append(
            (now, mean, max(usages, default=0.0), self._live - paused, paused, self.stats.output_tokens)
        )
        self._at(next_at if next_at is not None else now + self.workload.poll_s, POLL)

    def _prefill_rate(self, e: SimEngine) -> float | None:
        """Prefill tokens/s since the last poll, smoothed as ``EnginePool._prefill_rate`` does."""
        before = self._prefill_seen.get(e.name)
        self._prefill_seen[e.name] = (e.prefill_done, e.prefill_s)
        if before is None or e.prefill_s <= before[1] or e.prefill_done <= before[0]:
            return None
        sample = (e.prefill_done - before[0]) / (e.prefill_s - before[1])
        old = self.sched.state.engines[e.name].prefill_tok_s
        return sample if old <= 0 else 0.7 * old + 0.3 * sample

    def _on_fail(self, name: str, down_s: float) -> None:
        """An engine dies: its requests error out, the clients retry, the scheduler re-routes."""
        now = self.clock.now()
        engine = self.engines[name]
        self._lost(engine, engine.fail())
        self.sched.update_engine(name, healthy=False)
        if math.isfinite(down_s):
            self._at(now + down_s, RECOVER, name)

    def _lost(self, engine: SimEngine, requests: list[EngineRequest]) -> None:
        """Requests that died with their engine: errors to their clients, which retry."""
        now = self.clock.now()
        for r in requests:
            self._running.pop(r.request_id, None)
            self.sched.complete(r.request_id)
            self.stats.failed_requests += 1
            self._programs[r.program_id].attempt += 1
            self._at(now + self.workload.retry_s, SUBMIT, r.program_id)

    def _on_recover(self, name: str) -> None:
        self.engines[name].healthy = True
        self.sched.update_engine(name, healthy=True, kv_usage=0.0)
