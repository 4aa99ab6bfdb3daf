"""The shell around the scheduling core: carries out its decisions, tracks engine health and KV.

Requests wait here until ``Scheduler.dispatch`` starts them; a paused program's requests are
held the same way (pausing never touches the engine: vLLM's ``/pause`` is engine-wide).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Mapping

from rollyard.core.errors import ConfigError, EngineUnavailable
from rollyard.engines.base import Backend, EngineStats
from rollyard.engines.kvpool.config import KV_ROLES
from rollyard.gateway.metrics import GatewayMetrics
from rollyard.gateway.shards import shared_capacity
from rollyard.sched import KvBudget, Move, Pause, Restore, Scheduler, Start

_ACTIVE = KvBudget(buffer_tokens=0)  # per-engine active context tokens, for /metrics

log = logging.getLogger(__name__)


def check_roles(roles: Mapping[str, str], engines: Mapping[str, object]) -> dict[str, str]:
    """``engine.role`` per engine, checked: a typo would otherwise make the engine ``both``."""
    for name, role in roles.items():
        if name not in engines:
            raise ConfigError(f"a role for {name!r}, which is not an engine (engines: {sorted(engines)})")
        if role not in KV_ROLES:
            raise ConfigError(f"engine {name!r}: role {role!r} is not one of {sorted(KV_ROLES)}")
    if all(roles.get(n) == "prefill" for n in engines):
        raise ConfigError("every engine has role prefill: at least one engine must decode")
    return dict(roles)


class EnginePool:
    def __init__(
        self,
        backends: Mapping[str, Backend],
        scheduler: Scheduler,
        metrics: GatewayMetrics,
        capacity: int = 256,
        share: float = 1.0,
        roles: Mapping[str, str] | None = None,
    ) -> None:
        """``share``: this gateway shard's fraction of every engine (``gateway/shards.py``): its
        request slots and KV tokens are scaled by it, so the shards' sum is the engine's.
        ``roles``: engine -> ``engine.role`` (absent: both); prefill engines hold no program."""
        if not backends:
            raise EngineUnavailable("no engine is configured")
        self.backends = dict(backends)
        self.scheduler = scheduler
        self.metrics = metrics
        self.share = share
        self._waiters: dict[str, asyncio.Future[Start]] = {}
        self._ids = itertools.count()  # request ids never leave this process: a counter will do
        self._prefill_seen: dict[str, tuple[float, float]] = {}  # engine -> (tokens, seconds) so far
        self._hooks: list[Callable[[Pause | Restore], None]] = []
        self._restored: set[str] = set()  # programs restored since their last start (moves' why)
        # pauses, restores, moves: for the run's step rows (every key present, 0 until it happens)
        self.counts: Counter[str] = Counter(
            pauses=0,
            restores=0,
            moves=0,
            pool_restores=0,
            pool_moves=0,
            pd_prefills=0,
            pd_prefill_failures=0,
        )
        roles = check_roles(roles or {}, self.backends)
        for name in self.backends:
            scheduler.add_engine(name, shared_capacity(capacity, share), role=roles.get(name, "both"))
            metrics.engine_up.labels(name).set(1)

    @property
    def max_model_len(self) -> int:
        """The smallest known engine context; engines that have not said yet are skipped."""
        known = [b.max_model_len for b in self.backends.values() if b.max_model_len]
        return min(known) if known else 1 << 30

    async def probe(self) -> None:
        """Let engines learn their model and context length (``VLLMBackend.model_name``)."""
        for name, backend in self.backends.items():
            learn = getattr(backend, "model_name", None)
            if learn is None:
                continue
            try:
                await learn()
            except Exception as e:  # reported as down; the poller brings it back
                self.mark_down(name, type(e).__name__)

    async def acquire(
        self, program_id: str, prompt_tokens: int, max_tokens: int | None = None, chunk: int = 0
    ) -> Start:
        """Wait until the scheduler starts this request (``chunk``: its index under divided
        rollout); raises when no engine is healthy."""
        if not self.scheduler.healthy_engines():
            raise EngineUnavailable("no healthy engine; retry shortly", retry_after_s=2.0)
        rid = f"req_{next(self._ids)}"
        fut: asyncio.Future[Start] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self.scheduler.submit(rid, program_id, prompt_tokens, max_tokens, chunk)
        self._pump()
        try:
            d = await fut
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            self.scheduler.cancel(rid)
            self._pump()
            raise
        self.metrics.queue_wait.observe(d.waited_s)
        return d

    def release(self, start: Start, output_tokens: int | None = None, *, final: bool = True) -> None:
        """The request ended (``final=False``: one chunk of a divided request ended; more follow).

        After a chunk the freed slot is handed out on the loop's next turn, not now: the next
        chunk is submitted before that, so it competes for its own slot in the policy's order
        instead of losing it to whatever was queued."""
        self.scheduler.complete(start.request_id, output_tokens, final=final)
        if final:
            self.admit_if_due()
            self._pump()
        else:
            asyncio.get_running_loop().call_soon(self._pump)

    def forget(self, program_id: str) -> None:
        """A program ended: its KV claim is gone, so whoever waits for room may run now."""
        self.scheduler.forget(program_id)
        self._restored.discard(program_id)
        self.admit_if_due()
        self._pump()

    def admit_if_due(self) -> None:
        """Hand released KV to waiting programs now (policies with ``on_release``)."""
        if self.scheduler.admission_due():
            self._carry_out(self.scheduler.admit())

    def on_decision(self, hook: Callable[[Pause | Restore], None]) -> None:
        """Called with every pause and restore carried out (the program table mirrors them)."""
        self._hooks.append(hook)

    def _pump(self) -> None:
        moved: dict[str, bool] = {}  # program -> whether its move loads from the KV pool
        for d in self.scheduler.dispatch():
            if isinstance(d, Move):
                moved[d.program_id] = d.pooled  # the following Start carries moved_from
                log.info("program moved id=%s src=%s dst=%s why=%s", d.program_id, d.src, d.dst, d.reason)
                continue
            restored = d.program_id in self._restored
            self._restored.discard(d.program_id)
            if d.moved_from is not None:
                if d.program_id in moved:  # a reroute: the queue cost more (than a load, with a pool)
                    why = "pool" if moved[d.program_id] else "cost"
                else:  # restored onto another engine, else re-placed off a dead one
                    why = "restore" if restored else "replaced"
                self.metrics.moves.labels(why).inc()
                self.counts["moves"] += 1
                self.counts["pool_moves"] += why == "pool"
            fut = self._waiters.pop(d.request_id, None)
            if fut is None or fut.done():
                self.scheduler.complete(d.request_id)
            else:
                fut.set_result(d)

    def mark_down(self, name: str, why: str) -> None:
        moved = self.scheduler.engine_down(name)
        self._restored.difference_update(moved)  # re-placed off a dead engine: "replaced", not "restore"
        self.metrics.engine_up.labels(name).set(0)
        log.warning("engine down engine=%s reason=%s programs_moved=%d", name, why, len(moved))
        self._pump()

    async def refresh(self) -> None:
        """Poll every engine's stats once: KV usage for placement, health for routing."""
        for name, backend in self.backends.items():
            try:
                stats = await backend.stats()
            except Exception as e:  # any failure to answer means: do not route here
                if name in self.scheduler.up_engines():
                    self.mark_down(name, type(e).__name__)
                continue
            self.scheduler.update_engine(
                name,
                kv_usage=stats.kv_usage,
                kv_capacity_tokens=int(stats.kv_capacity_tokens * self.share),
                waiting=stats.waiting,
                prefill_tok_s=self._prefill_rate(name, stats),
                healthy=True,
            )
            self.metrics.kv_usage.labels(name).set(stats.kv_usage)
            self.metrics.engine_up.labels(name).set(1)
        self.observe_metrics()
        self._pump()

    def _prefill_rate(self, name: str, stats: EngineStats) -> float | None:
        """Prefill tokens/s since the last poll (computed, not cached, tokens over prefill time),
        smoothed; None until the engine has prefilled something new."""
        before = self._prefill_seen.get(name)
        self._prefill_seen[name] = (stats.prefill_tokens, stats.prefill_s)
        if before is None or stats.prefill_s <= before[1] or stats.prefill_tokens <= before[0]:
            return None
        sample = (stats.prefill_tokens - before[0]) / (stats.prefill_s - before[1])
        old = self.scheduler.state.engines[name].prefill_tok_s
        return sample if old <= 0 else 0.7 * old + 0.3 * sample

    def observe_metrics(self) -> None:
        """Programs by state and phase, active context tokens per engine (gauges for /metrics)."""
        state = self.scheduler.state
        counts = Counter((p.state.value, p.phase.value) for p in state.programs.values())
        for st in ("active", "paused"):
            for ph in ("reasoning", "acting"):
                self.metrics.sched_programs.labels(st, ph).set(counts.get((st, ph), 0))
        now = self.scheduler.clock.now()
        for name in state.engines:
            self.metrics.active_tokens.labels(name).set(_ACTIVE.used(state, name, now))

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)

    def tick(self) -> list[Pause | Restore]:
        """Run the admission policy once and start whatever its restores let run."""
        decisions = self.scheduler.tick()
        self._carry_out(decisions)
        if decisions:
            self._pump()
        self.observe_metrics()
        return decisions

    def _carry_out(self, decisions: list[Pause | Restore]) -> None:
        """Count, log and mirror applied pauses and restores (the scheduler already applied them)."""
        for d in decisions:
            self.counts["pauses" if isinstance(d, Pause) else "restores"] += 1
            if isinstance(d, Pause):
                self.metrics.pauses.inc()
                log.info("program paused id=%s engine=%s reason=%s", d.program_id, d.engine, d.reason)
            else:
                self.metrics.restores.inc()
                self._restored.add(d.program_id)
                self.metrics.hold.observe(d.held_s)
                if d.pooled:
                    self.metrics.pool_restores.inc()
                    self.counts["pool_restores"] += 1
                log.info(
                    "program restored id=%s engine=%s held_s=%.2f pooled=%s",
                    d.program_id, d.engine, d.held_s, d.pooled,
                )  # fmt: skip
            for hook in self._hooks:
                hook(d)

    async def tick_forever(self) -> None:
        """Call the policy every ``tick_s`` (nothing to do for policies that never pause)."""
        interval = self.scheduler.policy.tick_s
        if not interval:
            return
        while True:
            await asyncio.sleep(interval)
            self.tick()

    async def aclose(self) -> None:
        for b in self.backends.values():
            await b.aclose()
