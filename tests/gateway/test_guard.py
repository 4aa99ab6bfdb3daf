"""``GuardedBackend``'s decision: one failed request starts a health probe, and only a failed
probe or repeated failures hold the engine out (fake engine, fake clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from rollyard.core.clock import FakeClock
from rollyard.core.errors import EngineUnavailable
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion, CompletionDelta, EngineStats
from rollyard.gateway.breaker import CircuitBreaker
from rollyard.gateway.guard import GuardedBackend, GuardMetrics


class FlakyEngine:
    """Fails the calls it is told to; its health check answers ``healthy``."""

    name, max_model_len, policy_version = "e", 512, 0

    def __init__(self) -> None:
        self.fail = 0  # the next n calls fail with a dropped connection
        self.healthy = True
        self.health_checks = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if self.fail:
            self.fail -= 1
            raise EngineUnavailable("engine e dropped the connection")
        return Completion(
            token_ids=[1], logprobs=[-0.1], finish_reason=FinishReason.STOP, prompt_tokens=len(prompt_ids)
        )

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        yield CompletionDelta(token_ids=(await self.generate(prompt_ids, params)).token_ids, logprobs=[-0.1])

    async def stats(self) -> EngineStats:
        return EngineStats()

    async def health(self) -> bool:
        self.health_checks += 1
        await asyncio.sleep(0)
        return self.healthy


def guarded(threshold: int = 3) -> tuple[GuardedBackend, FlakyEngine, FakeClock]:
    clock, inner = FakeClock(), FlakyEngine()
    breaker = CircuitBreaker(clock, base_s=1.0, max_s=8.0, threshold=threshold)
    return GuardedBackend(inner, breaker, GuardMetrics(CollectorRegistry())), inner, clock  # type: ignore[arg-type]


P = SamplingParams(max_tokens=4)


async def test_one_dropped_connection_on_a_healthy_engine_keeps_it_in() -> None:
    g, inner, _ = guarded()
    inner.fail = 1
    with pytest.raises(EngineUnavailable):
        await g.generate([1, 2], P)
    assert await g.verdict() is True  # the probe ran and the engine answered its health check
    assert inner.health_checks == 1 and not g.held_out
    assert (await g.generate([1, 2], P)).token_ids == [1]  # and it serves at once


async def test_a_failure_whose_probe_fails_holds_the_engine_out() -> None:
    g, inner, clock = guarded()
    inner.fail, inner.healthy = 1, False
    with pytest.raises(EngineUnavailable):
        await g.generate([1], P)
    assert await g.verdict() is False and g.held_out and g.breaker.opens == 1
    with pytest.raises(EngineUnavailable) as e:  # held out: fails at once, without a call
        await g.generate([1], P)
    assert e.value.retry_after_s == pytest.approx(1.0)
    clock.advance(1.0)
    inner.healthy = True
    assert (await g.generate([1], P)).token_ids == [1]  # the probe after the backoff closes it
    assert g.breaker.state == "closed"


async def test_repeated_failures_open_it_even_while_health_answers() -> None:
    """Requests that keep failing with no success between them, each after its probe passed."""
    g, inner, _ = guarded(threshold=3)
    inner.fail = 3
    verdicts = []
    for _ in range(3):
        with pytest.raises(EngineUnavailable):
            await g.generate([1], P)
        verdicts.append(await g.verdict())
    assert verdicts == [True, True, False] and g.held_out and g.breaker.opens == 1


async def test_a_burst_of_failures_is_one_incident_decided_by_one_probe() -> None:
    """A stalled event loop fails many requests at once: the healthy engine stays in."""
    g, inner, _ = guarded(threshold=3)
    inner.fail = 20

    async def one() -> None:
        with pytest.raises(EngineUnavailable):
            async for _ in g.stream([1], P):
                pass

    await asyncio.gather(*(one() for _ in range(20)))
    assert await g.verdict() is True
    assert inner.health_checks == 1 and g.breaker.opens == 0
    assert (await g.generate([1], P)).token_ids == [1]
