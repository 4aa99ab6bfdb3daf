"""What it costs to rebuild a program's context on an engine that does not hold it.

Without a shared KV pool the engine re-prefills the whole context (at its measured prefill
rate, else the ``prefill_tok_s`` option); with one (``engine.kv_pool``; the scheduling option
``pool_load_tok_s`` > 0, set from the pool's kind by ``rollout.gateway_proc``) every full block
of the context was stored by whichever engine computed it, so the context loads at the pool's
rate instead. Routers (moves) and admission policies (restores off the program's engine) charge
this one figure, so the same decision weighs a move against a queue with and without a pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollyard.sched.views import EngineView, SchedState

__all__ = ["RebuildCost", "queue_delay_s"]


@dataclass(frozen=True)
class RebuildCost:
    prefill_tok_s: float = 2000.0  # used while the engine's own rate is not measured
    pool_load_tok_s: float = 0.0  # 0: no shared KV pool

    def __post_init__(self) -> None:
        if self.prefill_tok_s <= 0 or self.pool_load_tok_s < 0:
            raise ValueError("prefill_tok_s must be > 0 and pool_load_tok_s >= 0")

    @property
    def pooled(self) -> bool:
        """Whether contexts load from a shared pool instead of being re-prefilled."""
        return self.pool_load_tok_s > 0

    def known(self, dst: EngineView) -> bool:
        """Whether there is a measured basis for the cost on ``dst`` (the pool's rate, or its prefill)."""
        return self.pooled or dst.prefill_tok_s > 0

    def seconds(self, tokens: int, dst: EngineView) -> float:
        """Seconds to rebuild ``tokens`` of context on ``dst``: a pool load, else a re-prefill."""
        if self.pooled:
            return tokens / self.pool_load_tok_s
        return tokens / (dst.prefill_tok_s or self.prefill_tok_s)


def queue_delay_s(e: EngineView, state: SchedState) -> float:
    """Expected wait for a new request on ``e``: requests ahead of it (in the engine's queue,
    and in the gateway beyond its free slots) times the engine's per-request drain time."""
    if e.service_s <= 0:
        return 0.0  # not measured yet: no basis for a move
    if e.waiting == 0 and e.free > 0:
        return 0.0  # it starts now (and the gateway queue is not scanned on every request)
    queued = sum(
        1
        for r in state.queue
        if (p := state.programs.get(r.program_id)) and p.engine == e.name and not p.paused
    )
    ahead = e.waiting + max(0, queued - max(0, e.free))
    if ahead <= 0:
        return 0.0
    return ahead * e.service_s / max(1, e.in_flight)
