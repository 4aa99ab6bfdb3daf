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
from rollyard.tasks.families.base import ToolCall
from rollyard.tasks.model import Task
from rollyard.train.sft import run_sft

log = logging.getLogger(__name__)


def task_prompt_ids(task: Task, renderer: Renderer, cfg: Config) -> list[int]:
    """The ids the agent's first turn starts from: system prompt (with the tools) and the task's
    instruction, without the generation prompt."""
    agent = agent_config(cfg)
    tools = parse_tools(TOOLS)
    ids: list[int] = []
    for i, m in enumerate([Message("system", agent.system_prompt), Message("user", task.spec.instruction)]):
        ids.extend(renderer.message_ids(m, tools, first=i == 0))
    return ids


def tool_call_ids(renderer: Renderer, call: ToolCall) -> list[int]:
    """An assistant turn that makes ``call``, ending with its end-of-turn token."""
    return [*renderer.tok.encode(ct.format_tool_call(call.name, call.arguments)), renderer.tok.eos_id]


def tool_reply_ids(renderer: Renderer, content: str, n: int) -> list[int]:
    """Turn ``n``'s tool reply rendered as the agent sees it."""
    return renderer.message_ids(Message("tool", content, tool_call_id=f"call_{n}"), parse_tools(TOOLS), False)


async def solved_turns(
    task: Task, provider: SandboxProvider, renderer: Renderer, cfg: Config, mistake_prob: float, seed: int
) -> list[tuple[list[int], list[int]]]:
    """The scripted solver's episode as (context ids, completion ids) per assistant turn: the
    context is what the agent was shown before that turn (generation prompt included), the
    completion its tool call. Each call really runs in a sandbox, so the tool replies are the
    ones the agent would see."""
    agent = agent_config(cfg)
    context = task_prompt_ids(task, renderer, cfg)
    turns: list[tuple[list[int], list[int]]] = []
    sb = await prepare(task, provider)
    try:
        for n, call in enumerate(solve(task, mistake_prob=mistake_prob, seed=seed)):
            context = [*context, *renderer.gen_prompt_ids]
            completion = tool_call_ids(renderer, call)
            turns.append((context, completion))
            out = await run_tool(
                sb,
                call.name,
                json.dumps(call.arguments),
                timeout=agent.tool_timeout_s,
                max_chars=agent.max_tool_output_chars,
            )
            if out.submitted or n + 1 >= agent.max_turns:
                break
            context = [*context, *completion, *tool_reply_ids(renderer, out.content, n)]
    finally:
        await sb.close()
    return turns


async def demonstration(
    task: Task, provider: SandboxProvider, renderer: Renderer, cfg: Config, mistake_prob: float, seed: int
) -> Sample:
    """One solved episode as a training sample (prompt/observations masked, completions trained)."""
    ids: list[int] = []
    mask: list[int] = []
    for context, completion in await solved_turns(task, provider, renderer, cfg, mistake_prob, seed):
        shown = context[len(ids) :]  # each turn's context extends the previous turn's
        ids.extend([*shown, *completion])
        mask.extend([0] * len(shown) + [1] * len(completion))
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


def finished_warm_start(out_root: Path) -> Path | None:
    """The newest SFT model under ``out_root``, if a warm start already made one (resume)."""
    done = sorted(p for p in out_root.glob("v*") if (p / "config.json").is_file())
    return done[-1] if done else None


async def train_demonstrations(samples: list[Sample], base_dir: Path, out_root: Path, cfg: Config) -> Path:
    """Write ``samples`` under ``out_root`` and train ``sft.epochs`` over them on the trainer's
    SFT path; returns the new model dir."""
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
        seed=cfg.run.seed,
        token_budget=cfg.trainer.token_budget,
        train_layers=cfg.sft.train_layers,
    )
    log.info("sft done steps=%d final_loss=%.4f", result["steps"], result["losses"][-1])
    return Path(result["weights"])


async def warm_start(
    tasks: list[Task], provider: SandboxProvider, base_dir: Path, run_dir: Path, cfg: Config
) -> Path:
    """The SFT model dir under the run dir (made once; a resumed run reuses it)."""
    out_root = run_dir / "sft"
    if (done := finished_warm_start(out_root)) is not None:
        return done
    samples = await demonstrations(tasks, provider, base_dir, cfg, cfg.run.seed)
    return await train_demonstrations(samples, base_dir, out_root, cfg)
