"""SFT warm start: scripted-solver demonstrations, rendered exactly as the gateway renders a
rollout, trained with the trainer's SFT loss.

Each demonstration really runs the solver's tool calls in a sandbox, so the observations are
the ones the agent would see; the solver errs on purpose (``mistake_prob``), so the warm start
is imperfect and RL has something to fix. Only the assistant's completions are trained, as in
RL: the generation prompt is context, the completion's ids and its end-of-turn token are loss.
Training itself is the trainer's SFT path (``rollyard.train.sft.run_sft``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from pathlib import Path

from rollyard.agents.tools import TOOLS, run_tool
from rollyard.core.sample import Sample
from rollyard.engines import chat_template as ct
from rollyard.gateway.renderer import Renderer
from rollyard.gateway.routes_openai_chat import parse_tools
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.gateway.types import Message
from rollyard.rollout.config import Config
from rollyard.rollout.services import agent_config
from rollyard.rollout.threads import in_daemon_thread
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks import prepare, solve
from rollyard.tasks.model import Task
from rollyard.train.sft import run_sft

log = logging.getLogger(__name__)


async def demonstration(
    task: Task, provider: SandboxProvider, renderer: Renderer, cfg: Config, mistake_prob: float, seed: int
) -> Sample:
    """One solved episode as a training sample (prompt/observations masked, completions trained)."""
    agent = agent_config(cfg)
    tools = parse_tools(TOOLS)
    eos = renderer.tok.eos_id
    ids: list[int] = []
    mask: list[int] = []

    def add(part: list[int], trained: int) -> None:
        ids.extend(part)
        mask.extend([trained] * len(part))

    for i, m in enumerate([Message("system", agent.system_prompt), Message("user", task.spec.instruction)]):
        add(renderer.message_ids(m, tools, first=i == 0), 0)
    sb = await prepare(task, provider)
    try:
        for n, call in enumerate(solve(task, mistake_prob=mistake_prob, seed=seed)):
            add(renderer.gen_prompt_ids, 0)
            add([*renderer.tok.encode(ct.format_tool_call(call.name, call.arguments)), eos], 1)
            out = await run_tool(
                sb,
                call.name,
                json.dumps(call.arguments),
                timeout=agent.tool_timeout_s,
                max_chars=agent.max_tool_output_chars,
            )
            if out.submitted or n + 1 >= agent.max_turns:
                break
            add(renderer.message_ids(Message("tool", out.content, tool_call_id=f"call_{n}"), tools, False), 0)
    finally:
        await sb.close()
    zeros = [0.0] * len(ids)
    return Sample(token_ids=ids, loss_mask=mask, logprobs=zeros, advantages=zeros, group_id=f"sft-{task.id}")


async def demonstrations(
    tasks: list[Task], provider: SandboxProvider, model_dir: Path, cfg: Config, seed: int
) -> list[Sample]:
    renderer = Renderer(FastTokenizer(model_dir))
    rng = random.Random(seed)
    chosen = [tasks[rng.randrange(len(tasks))] for _ in range(cfg.sft.demos)]
    sem = asyncio.Semaphore(8)

    async def one(i: int, task: Task) -> Sample:
        async with sem:
            return await demonstration(task, provider, renderer, cfg, cfg.sft.mistake_prob, seed * 100003 + i)

    return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(chosen))))


def write_demonstrations(samples: list[Sample], path: Path) -> Path:
    """One ``Sample`` per line: the format the trainer's SFT path reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(s.model_dump_json() + "\n" for s in samples))
    tmp.replace(path)
    return path


async def warm_start(
    tasks: list[Task], provider: SandboxProvider, base_dir: Path, run_dir: Path, cfg: Config
) -> Path:
    """The SFT model dir under the run dir (made once; a resumed run reuses it)."""
    out_root = run_dir / "sft"
    done = sorted(p for p in out_root.glob("v*") if (p / "config.json").is_file())
    if done:
        return done[-1]
    seed = cfg.run.seed
    samples = await demonstrations(tasks, provider, base_dir, cfg, seed)
    log.info("sft demonstrations=%d tokens=%d", len(samples), sum(len(s.token_ids) for s in samples))
    data = write_demonstrations(samples, out_root / "demos.jsonl")
    steps = math.ceil(len(samples) * cfg.sft.epochs / cfg.sft.batch)
    result = await in_daemon_thread(
        run_sft,
        base_dir,
        data,
        out_root,
        steps=steps,
        batch_size=cfg.sft.batch,
        lr=cfg.sft.lr,
        seed=seed,
        token_budget=cfg.trainer.token_budget,
    )
    log.info("sft done steps=%d final_loss=%.4f", result["steps"], result["losses"][-1])
    return Path(result["weights"])
