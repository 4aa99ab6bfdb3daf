"""Prometheus metrics of one gateway (own registry, so several gateways can live in one process)."""

from __future__ import annotations

import asyncio
import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# holds are bounded by seconds-scale options (rollyard's max_hold_s: 30), so finer steps there
_HOLD_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 15, 20, 25, 30, 32, 35, 40, 50, 60, 120, 300, 600, 1800)
_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LAG_INTERVAL_S = 0.1  # how often the loop-lag probe wakes (~10 us of CPU each time)
_RECENT_LAG = 36_000  # an hour of samples at LAG_INTERVAL_S


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("rollyard_gateway_requests", "Model requests", ["api", "outcome"], registry=r)
        self.tokens = Counter("rollyard_gateway_tokens", "Tokens by kind", ["kind"], registry=r)
        self.latency = Histogram(
            "rollyard_gateway_request_seconds",
            "End-to-end latency",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "rollyard_gateway_overhead_seconds",
            "Latency added by the gateway (total minus engine time)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "rollyard_gateway_queue_seconds",
            "Time in the scheduler queue",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.programs = Gauge("rollyard_gateway_programs", "Programs by state", ["state"], registry=r)
        self.kv_usage = Gauge(
            "rollyard_engine_kv_usage", "Engine KV cache usage (0..1)", ["engine"], registry=r
        )
        self.engine_up = Gauge("rollyard_engine_up", "Engine healthy (1) or not (0)", ["engine"], registry=r)
        self.sched_programs = Gauge(
            "rollyard_sched_programs", "Programs the scheduler tracks", ["state", "phase"], registry=r
        )
        self.pauses = Counter("rollyard_sched_pauses", "Programs paused (KV pressure)", registry=r)
        self.restores = Counter("rollyard_sched_restores", "Paused programs restored", registry=r)
        self.pd_prefills = Counter(
            "rollyard_gateway_pd_prefills",
            "First prompts prefilled on a prefill engine for a decode engine (engine.role)",
            ["engine"],
            registry=r,
        )
        self.pd_prefill_failures = Counter(
            "rollyard_gateway_pd_prefill_failures",
            "Prefills that failed on the prefill engine; the decode engine computed the prompt",
            ["engine"],
            registry=r,
        )
        self.pd_prefill_s = Histogram(
            "rollyard_gateway_pd_prefill_seconds",
            "Seconds a prefill engine took for a first prompt",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pool_restores = Counter(
            "rollyard_sched_pool_restores",
            "Restores placed off the program's engine, its context charged a load from the KV pool",
            registry=r,
        )
        self.hold = Histogram(
            "rollyard_sched_hold_seconds",
            "How long a restored program was held (paused or unplaced)",
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.moves = Counter(
            "rollyard_sched_moves",
            "Programs re-homed to another engine (why: cost, pool: cost with a KV pool load, "
            "restore: restored onto another engine, replaced: its engine died)",
            ["why"],
            registry=r,
        )
        self.active_tokens = Gauge(
            "rollyard_sched_active_tokens",
            "Context tokens of active programs per engine",
            ["engine"],
            registry=r,
        )
        self.rewrites = Counter(
            "rollyard_gateway_context_rewrites", "History rewrites (new segments)", registry=r
        )
        self.malformed = Counter("rollyard_gateway_malformed_tool_calls", "Malformed tool calls", registry=r)
        self.retries = Counter(
            "rollyard_gateway_engine_retries",
            "Engine calls retried after their connection failed before the first token",
            registry=r,
        )

        self.loop_lag = Histogram(
            "rollyard_gateway_loop_lag_seconds",
            "How late a timer on the gateway's event loop fires: time every request waits for the loop",
            buckets=_LAG_BUCKETS,
            registry=r,
        )

        # the probe's recent samples, for ``lag_since_last_read`` (a run's step rows)
        self.recent_lag: collections.deque[float] = collections.deque(maxlen=_RECENT_LAG)

        self._token_kinds = [self.tokens.labels(k) for k in ("prompt", "reused", "completion")]
        self._by_api: dict[str, tuple[Counter, Histogram]] = {}

    def finished(self, api: str, total_s: float, engine_s: float) -> None:
        """One successful model request (labelled children cached: ``labels()`` costs a lock)."""
        pair = self._by_api.get(api)
        if pair is None:
            pair = self._by_api[api] = (self.requests.labels(api, "ok"), self.latency.labels(api))
        pair[0].inc()
        pair[1].observe(total_s)
        self.overhead.observe(max(0.0, total_s - engine_s))

    def counted_tokens(self, prompt: int, reused: int, completion: int) -> None:
        for child, n in zip(self._token_kinds, (prompt, reused, completion), strict=True):
            child.inc(n)

    def observe_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)
        self.recent_lag.append(seconds)

    def lag_since_last_read(self) -> tuple[float, float]:
        """p99 and max of the loop lag since the previous call (0s when no sample): what the
        trainer reports per step for a gateway in another process."""
        samples = sorted(self.recent_lag)
        self.recent_lag.clear()
        if not samples:
            return 0.0, 0.0
        return samples[min(len(samples) - 1, int(0.99 * len(samples)))], samples[-1]

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def watch_loop_lag(metrics: GatewayMetrics, interval_s: float = LAG_INTERVAL_S) -> None:
    """Observe, forever, how much later than asked ``asyncio.sleep(interval_s)`` returns. Work
    that holds the loop (a CPU-bound step, a blocking call) delays every request and ``/health``
    by as much; this tells it apart from a slow engine or a loaded host."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(interval_s)
        metrics.observe_lag(max(0.0, time.monotonic() - t - interval_s))
