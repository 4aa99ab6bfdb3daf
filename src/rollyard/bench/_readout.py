"""The reading demo's warm-started model and its agent turns, for benchmarks that need a policy
whose G samples of one prompt repeat each other, as an RL policy's do (``rollyard bench drafting``).

The model is SmolLM2-135M-Instruct after the reading demo's SFT warm start
(``configs/demo-smollm2.yaml``: scripted ``readout`` demonstrations, the start point of
``rollyard demo --model smollm2``), made by the demo's own code path (``rollout.sft.warm_start``).
Its weights are cached under ``cache_dir()/bench/drafting-<key>``, where the key hashes everything
that decides them (``sft_key``), so only the first run pays the SFT (minutes on 2 cores).

The prompts are real agent turns of ``readout`` tasks: the task prompt, then the same prompt
extended by the scripted solver's tool calls and the tool replies that really ran in a sandbox,
rendered as the gateway shows them to the agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rollyard.core.cache import cache_dir
from rollyard.rollout.config import Config, builtin_config, resolve_paths

log = logging.getLogger(__name__)

CONFIG = "demo-smollm2"
RECIPE = 1  # bump when the way the warm start is made changes, so a stale cache is not reused


def sft_config() -> Config:
    """The reading demo's config (paths still relative)."""
    return builtin_config(CONFIG)


def sft_key(cfg: Config) -> str:
    """A hash of what decides the warm-started weights: the base model, the task set, the
    agent's rendering, the SFT recipe, its seed and token budget (not paths, engine or RL knobs)."""
    parts: dict[str, Any] = {
        "model": cfg.model.model_dump(mode="json", exclude={"path", "create"}),
        "tasks": cfg.tasks.train.model_dump(mode="json"),
        "validate": cfg.tasks.validate_tasks,
        "agent": cfg.agent.model_dump(mode="json"),
        "context_limit": cfg.engine.max_model_len,
        "sft": cfg.sft.model_dump(mode="json"),
        "seed": cfg.run.seed,
        "token_budget": cfg.trainer.token_budget,
        "recipe": RECIPE,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def sft_dir(cfg: Config, root: Path | None = None) -> Path:
    """Where the warm start made from ``cfg`` is cached."""
    return (root or cache_dir() / "bench") / f"drafting-{sft_key(cfg)}"


async def _warm_start(cfg: Config, work: Path) -> Path:
    from rollyard.rollout.prepare import ensure_model, ensure_tasks
    from rollyard.rollout.services import make_provider
    from rollyard.rollout.sft import warm_start

    provider = make_provider(cfg, work)
    train_tasks, _ = await ensure_tasks(cfg, work, provider)
    return await warm_start(train_tasks, provider, ensure_model(cfg), work, cfg)


def sft_model(cfg: Config | None = None, root: Path | None = None) -> Path:
    """The warm-started model directory: from the cache, else made (and cached) now."""
    cfg = cfg or sft_config()
    where = sft_dir(cfg, root)
    done = where / "model"
    if (done / "config.json").is_file():
        return done
    work = where.with_name(where.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg = resolve_paths(cfg.model_copy(deep=True), work)
    cfg.tasks.eval = None  # the warm start needs the train set only
    log.info("warm-starting %s into %s", CONFIG, where)
    weights = asyncio.run(_warm_start(cfg, work))
    where.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(where / "tasks", ignore_errors=True)
    os.replace(work / "tasks", where / "tasks")
    os.replace(weights, done)  # last: a cut-short run leaves no model to reuse
    shutil.rmtree(work, ignore_errors=True)
    return done


def agent_turns(model: Path, n_tasks: int, cfg: Config | None = None) -> list[list[list[int]]]:
    """For each of the first ``n_tasks`` cached train tasks, the contexts of the scripted
    solver's turns (no mistakes): the task prompt, then after each tool reply, each ending with
    the generation prompt."""
    from rollyard.gateway.renderer import Renderer
    from rollyard.gateway.tokenizer import FastTokenizer
    from rollyard.rollout.services import make_provider
    from rollyard.rollout.sft import solved_turns
    from rollyard.tasks import load_tasks

    cfg = cfg or sft_config()
    tasks = load_tasks(model.parent / "tasks" / "train")[:n_tasks]
    renderer = Renderer(FastTokenizer(model))
    provider = make_provider(cfg, model.parent)

    async def turns() -> list[list[list[int]]]:
        out = []
        for i, task in enumerate(tasks):
            solved = await solved_turns(task, provider, renderer, cfg, mistake_prob=0.0, seed=i)
            out.append([context for context, _ in solved])
        return out

    return asyncio.run(turns())
