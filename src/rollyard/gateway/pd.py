"""Prefill/decode split through the shared KV pool (``engine.role``, docs/kv-pool.md).

A program's first prompt of at least ``min_prompt_tokens`` is sent to a prefill engine with
``max_tokens`` 1: that engine computes the prompt and its pool connector stores every full block.
The request then runs as usual on the decode engine the scheduler picks, whose connector loads
those blocks by their hashes instead of computing them (a store-based pool needs no transfer
parameters between the two calls). Later turns extend a context their decode engine holds, so
they skip this stage. Prefill engines are known to the scheduler (health, fences) but never hold
a program (``EngineView.role``). A prefill that fails on the engine's side (unreachable, a 5xx, an
unreadable answer) is logged, counted (``pd_prefill_failures``) and skipped: the decode engine
computes the prompt itself. A client error (a 4xx: the prompt itself is refused) is raised, since
the decode engine would refuse it too.
"""

from __future__ import annotations

import logging
from collections import Counter

from rollyard.core.errors import RollyardError
from rollyard.core.sampling import SamplingParams
from rollyard.engines.launcher import DEFAULT_BLOCK_SIZE
from rollyard.gateway.pool import EnginePool

log = logging.getLogger(__name__)

__all__ = ["PrefillStage"]


class PrefillStage:
    def __init__(self, pool: EnginePool, min_prompt_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE):
        self.pool = pool
        self.min_prompt_tokens = min_prompt_tokens
        self.block_size = block_size  # the engines' KV block: the pool stores full blocks only
        self.names = [n for n, e in pool.scheduler.state.engines.items() if e.role == "prefill"]
        self._busy: Counter[str] = Counter()  # prefills in flight per engine

    def applies(self, first_turn: bool, prompt_tokens: int) -> bool:
        """A first prompt long enough, with a full block the decode engine can load: it computes
        the last prompt token itself, so ``(n - 1) // block_size`` blocks come from the pool."""
        loadable = (prompt_tokens - 1) // self.block_size
        return bool(self.names) and first_turn and prompt_tokens >= self.min_prompt_tokens and loadable > 0

    async def prefill(self, prompt_ids: list[int], params: SamplingParams) -> str | None:
        """Compute the prompt on the least busy healthy prefill engine; returns its name (None:
        none ran it)."""
        engines = self.pool.scheduler.state.engines
        up = [n for n in self.names if engines[n].healthy]
        if not up or not self.pool.scheduler.healthy_engines():  # no decode engine: the turn fails
            return None  # there, without a prefill engine's time spent on it first
        name = min(up, key=lambda n: (self._busy[n], n))
        self._busy[name] += 1
        started = self.pool.scheduler.clock.now()
        try:
            await self.pool.backends[name].generate(prompt_ids, params.model_copy(update={"max_tokens": 1}))
        except Exception as e:  # not CancelledError (a BaseException): a cancelled turn stops here
            if isinstance(e, RollyardError) and e.http_status < 500:
                raise  # the request itself is refused: the decode engine would refuse it too
            log.warning("prefill skipped engine=%s reason=%s: %s", name, type(e).__name__, str(e)[:200])
            self.pool.metrics.pd_prefill_failures.labels(name).inc()
            self.pool.counts["pd_prefill_failures"] += 1
            return None
        finally:
            self._busy[name] -= 1
        self.pool.metrics.pd_prefills.labels(name).inc()
        self.pool.metrics.pd_prefill_s.observe(self.pool.scheduler.clock.now() - started)
        self.pool.counts["pd_prefills"] += 1
        return name
