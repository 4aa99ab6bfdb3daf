"""What a simulation measured: per-request and per-program times, time series for the plots,
and the summary a reader compares policies by."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SimStats", "quantile"]


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation (0.0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class SimStats:
    request_latency: list[float] = field(default_factory=list)  # submit -> last token
    ttft: list[float] = field(default_factory=list)  # submit -> first token
    queue_wait: list[float] = field(default_factory=list)  # submit -> started on an engine
    program_latency: list[float] = field(default_factory=list)  # first submit -> last token
    program_end: list[float] = field(default_factory=list)
    hold_s: list[float] = field(default_factory=list)  # a pause's length (Restore.held_s)
    pauses: int = 0
    moves: int = 0
    failed_requests: int = 0
    output_tokens: int = 0
    # time series, one row per poll: (t, mean KV usage, max KV usage, active, paused, tokens so far)
    series: list[tuple[float, float, float, int, int, int]] = field(default_factory=list)
    trainer_steps: int = 0
    trainer_idle_s: float = 0.0
    staleness: list[int] = field(default_factory=list)
    dropped: int = 0
    trainer_started: int = 0  # steps begun (the last may still run when the programs end)
    trained_tokens: int = 0  # tree-merged tokens the trainer stepped on
    train_s: float = 0.0  # seconds the trainer spent stepping
    publish_s: float = 0.0  # seconds spent publishing (staging and fence)
    fence_s: float = 0.0  # of which every engine stood fenced
    publishes: int = 0

    def summary(self, makespan_s: float, engines: list[Any]) -> dict[str, Any]:
        prompt = sum(e.prompt_tokens for e in engines)
        busy = sum(e.busy_s for e in engines)
        out: dict[str, Any] = {
            "makespan_s": makespan_s,
            "output_tok_s": self.output_tokens / makespan_s if makespan_s else 0.0,
            "programs": len(self.program_latency),
            "programs_per_h": 3600.0 * len(self.program_latency) / makespan_s if makespan_s else 0.0,
            "req_p50_s": quantile(self.request_latency, 0.5),
            "req_p99_s": quantile(self.request_latency, 0.99),
            "ttft_p50_s": quantile(self.ttft, 0.5),
            "ttft_p99_s": quantile(self.ttft, 0.99),
            "wait_p99_s": quantile(self.queue_wait, 0.99),
            "program_p50_s": quantile(self.program_latency, 0.5),
            "program_p99_s": quantile(self.program_latency, 0.99),
            "preemptions": sum(e.preemptions for e in engines),
            "recomputed_tokens": sum(e.recomputed_tokens for e in engines),
            "prefill_tokens": sum(e.prefill_done for e in engines),  # prompt tokens computed
            "pool_loaded_tokens": sum(e.loaded_tokens for e in engines),  # loaded from the shared pool
            "prefix_hit_rate": sum(e.hit_tokens for e in engines) / prompt if prompt else 0.0,
            "engine_busy": busy / (makespan_s * len(engines)) if makespan_s else 0.0,
            "kv_usage_mean": statistics.fmean(r[1] for r in self.series) if self.series else 0.0,
            "pauses": self.pauses,
            "hold_p50_s": quantile(self.hold_s, 0.5),
            "hold_p99_s": quantile(self.hold_s, 0.99),
            "hold_s_total": sum(self.hold_s),
            "moves": self.moves,
            "failed_requests": self.failed_requests,
        }
        if self.trainer_started:
            out["trainer_steps"] = self.trainer_steps
            out["trainer_idle"] = self.trainer_idle_s / makespan_s if makespan_s else 0.0
            out["staleness_mean"] = statistics.fmean(self.staleness) if self.staleness else 0.0
            out["dropped"] = self.dropped
            train = self.train_s / self.trainer_started
            publish = self.publish_s / self.publishes if self.publishes else 0.0
            out["train_step_s"] = train
            out["publish_step_s"] = publish
            out["publish_share"] = publish / (train + publish) if train + publish else 0.0  # of a step
            out["fence_share"] = self.fence_s / makespan_s if makespan_s else 0.0  # of the run: fenced
            out["trained_tok_s"] = self.trained_tokens / makespan_s if makespan_s else 0.0
        return out
