"""SFT warm start for a black-box CLI: its own prompts, each answered with a short final reply
that ends with the model's end-of-turn token.

A model that never ends its turn is cut at ``max_tokens`` on every call, and the CLIs treat
that as a failure (Codex: an incomplete response, exit 1; Claude Code: "response exceeded the
output token maximum"). The white-box demonstrations cannot teach a CLI's turn ending: its
prompts are its own. So the warm start runs the CLI on the base model for ``sft.demos``
programs (the run's engine, gateway and sandboxes, journal under ``RUN/sft/``), takes every
recorded turn's prompt ids (exactly what the gateway rendered for the CLI, generation prompt
included), pairs each with the profile's ``finish`` reply plus the end-of-turn token, and
trains that on the trainer's SFT path.
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

from rollyard.agents.blackbox import load_profile
from rollyard.agents.blackbox.profile import FinishReply
from rollyard.core.errors import ConfigError
from rollyard.core.sample import Sample
from rollyard.engines import chat_template as ct
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.rollout.collect import LocalRunner, run_program
from rollyard.rollout.config import Config
from rollyard.rollout.services import open_services
from rollyard.rollout.sft import finished_warm_start, train_demonstrations
from rollyard.tasks.model import Task
from rollyard.train.sft import demonstration_sample

log = logging.getLogger(__name__)


def finish_ids(tok: FastTokenizer, finish: FinishReply) -> list[int]:
    """The reply's ids as the model should sample them: text, then the tool call if any, then
    the end-of-turn token (the gateway parses the call from the text, as for any turn)."""
    text = finish.text
    if finish.tool is not None:
        text = (text + "\n" if text else "") + ct.format_tool_call(finish.tool, finish.arguments)
    return [*tok.encode(text), tok.eos_id]


def eot_samples(prompts: list[list[int]], reply: list[int]) -> list[Sample]:
    """One sample per prompt: the prompt is context, the reply (and its end of turn) is loss."""
    return [demonstration_sample({"prompt_ids": p, "completion_ids": reply}) for p in prompts if p]


async def cli_prompts(cfg: Config, root: Path, tasks: list[Task], base_dir: Path) -> list[list[int]]:
    """Every turn's prompt ids from ``sft.demos`` programs of the CLI on ``base_dir``'s model."""
    rng = random.Random(cfg.run.seed)
    chosen = [tasks[rng.randrange(len(tasks))] for _ in range(cfg.sft.demos)]
    async with open_services(cfg, root, base_dir, 0) as svc:
        runner = LocalRunner(svc, cfg.agent.timeout_s)
        trajs = await asyncio.gather(
            *(run_program(svc, runner, t, f"sft-{i}", cfg.run.temperature) for i, t in enumerate(chosen))
        )
    finishes = [turn.finish_reason.value for t in trajs for turn in t.turns]
    log.info(
        "sft cli programs=%d turns=%d finish_reasons=%s",
        len(trajs),
        len(finishes),
        {f: finishes.count(f) for f in sorted(set(finishes))},
    )
    return [turn.prompt_ids for t in trajs for turn in t.turns]


async def cli_warm_start(tasks: list[Task], base_dir: Path, run_dir: Path, cfg: Config) -> Path:
    """The SFT model dir under ``RUN/sft`` (made once; a resumed run reuses it)."""
    out_root = run_dir / "sft"
    if (done := finished_warm_start(out_root)) is not None:
        return done
    if cfg.agent.profile is None:
        raise ConfigError("a blackbox warm start needs agent.profile")
    prompts = await cli_prompts(cfg, out_root, tasks, base_dir)
    if not prompts:
        raise ConfigError(
            f"{cfg.agent.profile} made no model call on the base model: nothing to warm start on"
        )
    reply = finish_ids(FastTokenizer(base_dir), load_profile(cfg.agent.profile).finish)
    return await train_demonstrations(eot_samples(prompts, reply), base_dir, out_root, cfg)
