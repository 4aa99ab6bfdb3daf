"""``GuardedBackend``: an engine behind a circuit breaker, so connection trouble fails fast.

It wraps any ``Backend``. A connection-level failure (``EngineUnavailable``: refused, reset,
timed out, stats poll failed) opens the engine's breaker; while open, every call fails at once
with ``EngineUnavailable(retry_after_s=...)`` without touching the engine, including the
pool's stats poll, so the pool cannot mark the engine healthy before the backoff ends. The
first call after it is a probe: success closes the breaker, failure reopens it for longer.

An error the engine *answers* with (``EngineError``, ``InvalidRequest``) passes through
untouched: the engine is alive and the error belongs to the request that caused it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from rollyard.core.errors import EngineUnavailable
from rollyard.core.sampling import SamplingParams
from rollyard.engines.base import Backend, Completion, CompletionDelta, EngineStats
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
        self.throttled = Counter(
            "rollyard_gateway_programs_throttled",
            "Programs throttled by their error budget",
            registry=registry,
        )


class GuardedBackend:
    def __init__(self, inner: Backend, breaker: CircuitBreaker, metrics: GuardMetrics) -> None:
        self.inner, self.breaker, self.metrics = inner, breaker, metrics
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:  # everything not guarded: the engine's own
        return getattr(self.inner, attr)

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def _gate(self) -> None:
        wait = self.breaker.wait_s()
        if wait > 0:
            raise EngineUnavailable(
                f"engine {self.name} is held out for {wait:.1f}s after connection failures",
                retry_after_s=wait,
            )

    def _failed(self, e: EngineUnavailable) -> None:
        opens = self.breaker.opens
        backoff = self.breaker.failure()
        if self.breaker.opens == opens:
            return  # one more request of the incident that opened it
        self.metrics.breaker_opens.labels(self.name).inc()
        self.metrics.breaker_open.labels(self.name).set(1)
        log.warning(
            "engine breaker open engine=%s backoff_s=%.1f reason=%s", self.name, backoff, e.message[:200]
        )

    def _ok(self) -> None:
        if self.breaker.failures:
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
