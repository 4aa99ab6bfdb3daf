"""``GuardedBackend``: an engine behind a circuit breaker, so connection trouble fails fast.

It wraps any ``Backend``. A connection-level failure (``EngineUnavailable``: refused, reset,
timed out, stats poll failed) counts against the engine's breaker and starts one health probe
of the engine; failures while that probe runs are the same incident and are not counted. The
breaker opens when the probe fails, or after ``threshold`` counted failures with no successful
call between them, not on one request's dropped connection (or a burst of them, as a stalled
event loop gives) while the engine answers its health check and everyone else.
While open, every call fails at once with ``EngineUnavailable(retry_after_s=...)`` without
touching the engine, including the pool's stats poll, so the pool cannot mark the engine
healthy before the backoff ends. The first call after it is a probe: success closes the
breaker, failure reopens it for longer. ``held_out`` tells the gateway whether to route
around the engine (``EnginePool.mark_down``).

An error the engine *answers* with (``EngineError``, ``InvalidRequest``) passes through
untouched: the engine is alive and the error belongs to the request that caused it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge

from rollyard.core.errors import EngineUnavailable
from rollyard.core.sampling import SamplingParams
from rollyard.engines.base import Backend, Completion, CompletionDelta, EngineStats, WrappedBackend
from rollyard.gateway.breaker import CircuitBreaker

log = logging.getLogger(__name__)


class GuardMetrics:
    """The breaker's and the error budget's counters, on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.breaker_opens = Counter(
            "rollyard_engine_breaker_opens", "Engine circuit breaker openings", ["engine"], registry=registry
        )
        self.breaker_open = Gauge(
            "rollyard_engine_breaker_open",
            "Engine held out by its breaker (1) or not",
            ["engine"],
            registry=registry,
        )
        self.request_errors = Counter(
            "rollyard_gateway_request_errors",
            "Failed model requests by cause (request: the request caused it; engine: the engine did)",
            ["cause"],
            registry=registry,
        )
        self.resends = Gauge(
            "rollyard_engine_resends",
            "Engine requests resent after their connection dropped before any answer (kept-alive "
            "connections the engine closed as they were reused)",
            ["engine"],
            registry=registry,
        )
        self.idle_ended = Counter(
            "rollyard_gateway_programs_idle_ended",
            "Programs terminated after idling longer than the program TTL (never finished)",
            registry=registry,
        )
        self.throttled = Counter(
            "rollyard_gateway_programs_throttled",
            "Programs throttled by their error budget",
            registry=registry,
        )


class GuardedBackend(WrappedBackend):
    def __init__(self, inner: Backend, breaker: CircuitBreaker, metrics: GuardMetrics) -> None:
        super().__init__(inner)
        self.breaker, self.metrics = breaker, metrics
        metrics.resends.labels(self.name).set_function(lambda: float(getattr(inner, "resent", 0)))
        self._probe: asyncio.Task[None] | None = None

    def _gate(self) -> None:
        wait = self.breaker.wait_s()
        if wait > 0:
            raise EngineUnavailable(
                f"engine {self.name} is held out for {wait:.1f}s after connection failures",
                retry_after_s=wait,
            )

    @property
    def held_out(self) -> bool:
        """The breaker is open: route around this engine until its backoff ends."""
        return self.breaker.wait_s() > 0

    def _failed(self, e: EngineUnavailable) -> None:
        if self._probe is not None and not self._probe.done():
            return  # the same incident as the failure whose probe is under way: it decides
        opens = self.breaker.opens
        backoff = self.breaker.failure()
        if self.breaker.opens != opens:
            self._opened(backoff, e.message)
        elif not backoff:  # still closed: the engine's own health check decides
            self._start_probe(e.message)

    def _opened(self, backoff: float, why: str) -> None:
        self.metrics.breaker_opens.labels(self.name).inc()
        self.metrics.breaker_open.labels(self.name).set(1)
        log.warning("engine breaker open engine=%s backoff_s=%.1f reason=%s", self.name, backoff, why[:200])

    def _start_probe(self, why: str) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._check(why))

    async def _check(self, why: str) -> None:
        try:
            ok = await self.inner.health()
        except Exception:  # a probe that cannot run is a failed probe
            ok = False
        log.info("engine probe after a failed request engine=%s ok=%s failure=%s", self.name, ok, why[:200])
        if ok:
            return
        opens = self.breaker.opens
        backoff = self.breaker.trip()
        if self.breaker.opens != opens:
            self._opened(backoff, f"health probe failed after: {why}")

    async def verdict(self) -> bool:
        """Wait for the probe a failure started (if any); True when the engine may be used."""
        if self._probe is not None and not self._probe.done():
            await asyncio.shield(self._probe)
        return not self.held_out

    def _ok(self) -> None:
        if self.breaker.streak:
            log.info("engine breaker closed engine=%s", self.name)
            self.metrics.breaker_open.labels(self.name).set(0)
        self.breaker.success()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self._gate()
        try:
            out = await self.inner.generate(prompt_ids, params)
        except EngineUnavailable as e:
            self._failed(e)
            raise
        self._ok()
        return out

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        self._gate()
        try:
            async for d in self.inner.stream(prompt_ids, params):
                yield d
        except EngineUnavailable as e:
            self._failed(e)
            raise
        self._ok()

    async def stats(self) -> EngineStats:
        self._gate()
        try:
            out = await self.inner.stats()
        except EngineUnavailable as e:
            self._failed(e)
            raise
        self._ok()
        return out
