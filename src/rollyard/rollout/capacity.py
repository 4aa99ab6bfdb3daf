"""How many programs run at once when ``run.max_programs`` is not set: what the hardware holds.

The rule (docs/training.md, "What a run does"), the smallest of:

- **KV**: ``PROGRAMS_PER_CONTEXT`` x (sum over engines of its KV tokens) / ``engine.max_model_len``.
  An engine's KV tokens are what it reports (vLLM's ``cache_config_info``), capped by
  ``engine.kv_tokens``; one that reports nothing counts as ``engine.kv_tokens``, or one context.
  Two programs per full context: a program spends part of its time in its sandbox, and rarely
  holds a full context; the scheduler pauses programs when KV runs short, so more waiting
  programs than this only queue there.
- **CPU** (local sandboxes only): ``PROGRAMS_PER_CORE`` x the cores this process may use. A
  sandbox runs commands for a small share of a program's time; the rest it waits on the model.
- **Memory** (local sandboxes only): the memory available at start / the sandbox's
  ``memory_mb`` limit, so every program may reach its limit at once without swapping.

With ``ray.address`` set, sandboxes run on the cluster's workers, so only the KV bound applies.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from rollyard.engines.base import Backend
from rollyard.rollout.config import Config

log = logging.getLogger(__name__)

PROGRAMS_PER_CONTEXT = 2
PROGRAMS_PER_CORE = 8


@dataclass(frozen=True)
class Hardware:
    """What the rule reads: each engine's KV tokens (0: not reported), cores, memory."""

    engine_kv_tokens: tuple[int, ...]
    cores: int
    available_mb: int

    @classmethod
    def here(cls, engine_kv_tokens: Sequence[int]) -> Hardware:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return cls(tuple(engine_kv_tokens), cores, _available_mb())


def _available_mb() -> int:
    """MemAvailable (Linux: free + reclaimable), else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


def default_max_programs(cfg: Config, hw: Hardware) -> tuple[int, dict[str, int]]:
    """The rule's value and each bound's (for the log and the tests)."""
    cap = cfg.engine.kv_tokens
    per_engine = [
        min(k, cap) if k and cap else (k or cap or cfg.engine.max_model_len) for k in hw.engine_kv_tokens
    ]
    bounds = {"kv": PROGRAMS_PER_CONTEXT * sum(per_engine) // cfg.engine.max_model_len}
    if not cfg.ray.address:
        bounds["cpu"] = PROGRAMS_PER_CORE * hw.cores
        bounds["memory"] = hw.available_mb // cfg.sandbox.program_limits().memory_mb
    return max(1, min(bounds.values())), bounds


async def engine_kv_tokens(backends: Sequence[Backend]) -> list[int]:
    """Each engine's reported KV capacity in tokens (0 where it does not answer)."""

    async def one(b: Backend) -> int:
        try:
            stats = await b.stats()
        except Exception:  # a late or odd engine counts as unknown, not as a failed run
            return 0
        return int(stats.kv_capacity_tokens or 0)

    return list(await asyncio.gather(*(one(b) for b in backends)))


async def program_slots(cfg: Config, backends: Sequence[Backend]) -> int:
    """``run.max_programs`` when set, else the rule on this machine and these engines."""
    if cfg.run.max_programs is not None:
        return cfg.run.max_programs
    n, bounds = default_max_programs(cfg, Hardware.here(await engine_kv_tokens(backends)))
    log.info("run.max_programs unset: %d programs at once (bounds %s)", n, bounds)
    return n
