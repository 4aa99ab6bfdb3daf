"""The shell around the scheduling core: carries out its decisions, tracks engine health and KV.

Requests wait here until ``Scheduler.dispatch`` starts them; a paused program's requests are
held the same way (pausing never touches the engine: vLLM's ``/pause`` is engine-wide).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping

from rollyard.core.errors import EngineUnavailable
from rollyard.engines.base import Backend
from rollyard.gateway.metrics import GatewayMetrics
from rollyard.sched import Move, Pause, Restore, Scheduler, Start

log = logging.getLogger(__name__)


class EnginePool:
    def __init__(
        self,
        backends: Mapping[str, Backend],
        scheduler: Scheduler,
        metrics: GatewayMetrics,
        capacity: int = 256,
    ) -> None:
        if not backends:
            raise EngineUnavailable("no engine is configured")
        self.backends = dict(backends)
        self.scheduler = scheduler
        self.metrics = metrics
        self._waiters: dict[str, asyncio.Future[Start]] = {}
        self._ids = itertools.count()  # request ids never leave this process: a counter will do
        for name in self.backends:
            scheduler.add_engine(name, capacity)
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
            self._pump()
        else:
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        for d in self.scheduler.dispatch():
            if isinstance(d, Move):
                continue  # the following Start carries moved_from
            fut = self._waiters.pop(d.request_id, None)
            if fut is None or fut.done():
                self.scheduler.complete(d.request_id)
            else:
                fut.set_result(d)

    def mark_down(self, name: str, why: str) -> None:
        moved = self.scheduler.engine_down(name)
        self.metrics.engine_up.labels(name).set(0)
        log.warning("engine down engine=%s reason=%s programs_moved=%d", name, why, len(moved))
        self._pump()

    async def refresh(self) -> None:
        """Poll every engine's stats once: KV usage for placement, health for routing."""
        for name, backend in self.backends.items():
            try:
                stats = await backend.stats()
            except Exception as e:  # any failure to answer means: do not route here
                if name in self.scheduler.healthy_engines():
                    self.mark_down(name, type(e).__name__)
                continue
            self.scheduler.update_engine(name, kv_usage=stats.kv_usage, healthy=True)
            self.metrics.kv_usage.labels(name).set(stats.kv_usage)
            self.metrics.engine_up.labels(name).set(1)
        self._pump()

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)

    def tick(self) -> list[Pause | Restore]:
        """Run the admission policy once and start whatever its restores let run."""
        decisions = self.scheduler.tick()
        if decisions:
            self._pump()
        return decisions

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
