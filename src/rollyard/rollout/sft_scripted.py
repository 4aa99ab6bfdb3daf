"""Warm start for a black-box CLI on demonstrations in its own turn format (``sft.kind: scripted``).

The CLI runs unmodified (its own prompts, tool calls and observations, in its sandbox, through
the run's gateway) for ``sft.demos`` programs, but the engine behind the gateway is a script: a
stand-in in vLLM's HTTP shape (``engines.canned`` with a replier) that answers each turn
with the tool call a solver would make next, rendered as the model emits it (the chat
template's tool-call text, then the end-of-turn token). Every recorded turn (the prompt ids the
gateway rendered for the CLI, the reply ids) is one SFT sample, so the warm start teaches the
CLI's real prompt format, not a white-box approximation of it.

The script knows only what the model would: the key from the task text in the CLI's prompt and
the value from the ``grep`` output the CLI put back into the prompt. With ``sft.mistake_prob``
a program's first reply writes a guessed value without looking (the shortcut RL must unlearn).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from rollyard.agents.blackbox import load_profile
from rollyard.core.errors import ConfigError
from rollyard.core.net import free_port
from rollyard.core.sample import Sample
from rollyard.core.trajectory import FinishReason, Trajectory
from rollyard.engines import chat_template as ct
from rollyard.engines.canned import Reply, make_app
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.rollout.collect import LocalRunner, run_program
from rollyard.rollout.config import SCRIPTED_FAMILIES, Config
from rollyard.rollout.remote_fence import RemoteFenced
from rollyard.rollout.services import EngineFleet, open_services
from rollyard.rollout.sft import finished_warm_start, train_demonstrations
from rollyard.rollout.sft_blackbox import finish_ids
from rollyard.tasks.families.lookup import ANSWER
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)

_KEY = re.compile(r"Find the value of (\w+) in data/")
_CALL = re.compile(re.escape(ct.TOOL_CALL_OPEN) + r"(.*?)" + re.escape(ct.TOOL_CALL_CLOSE), re.S)


def commands(text: str) -> list[str]:
    """The ``bash`` commands of the assistant's tool calls in the rendered prompt ``text`` (from
    its first assistant turn on: the system prompt's tool examples are not calls)."""
    out = []
    start = text.find(f"{ct.IM_START}assistant\n")
    for m in _CALL.finditer(text, start if start >= 0 else len(text)):
        try:
            call = json.loads(m.group(1))
        except ValueError:
            continue
        args = call.get("arguments") if isinstance(call, dict) else None
        if isinstance(args, dict) and isinstance(args.get("command"), str):
            out.append(args["command"])
    return out


class ReadoutScript:
    """The demonstrator of a ``readout`` task in a bash-tool CLI: ``grep -r KEY data``, then write
    the value that grep printed to answer.txt, then the profile's finish call; with
    ``mistake_prob`` the first reply writes a guess instead. Stateless per prompt (the turn is
    read from the tool calls already in it), so concurrent programs need no bookkeeping."""

    def __init__(self, tok: FastTokenizer, finish: list[int], mistake_prob: float, seed: int) -> None:
        self.tok, self.finish, self.mistake_prob = tok, finish, mistake_prob
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.guesses = self.reads = 0

    def command(self, text: str) -> str | None:
        """The next command for the prompt ``text``; None: the profile's finish call."""
        key = _KEY.search(text)
        if key is None:
            raise ConfigError(
                "the scripted warm start found no 'Find the value of KEY' task in the CLI's prompt"
            )
        done = commands(text)
        if not done:
            with self._lock:
                guess = self._rng.random() < self.mistake_prob
                value = str(self._rng.randint(10, 99))
            if guess:
                self.guesses += 1
                return f"echo {value} > {ANSWER}"
            self.reads += 1
            return f"grep -r {key.group(1)} data"
        if done[-1].startswith("grep"):
            seen = re.findall(rf"\b{key.group(1)}=(\d+)", text)  # only the tool output holds key=value
            if seen:
                return f"echo {seen[-1]} > {ANSWER}"
        return None

    def __call__(self, prompt_ids: list[int], max_tokens: int) -> Reply:
        cmd = self.command(self.tok.decode(prompt_ids))
        ids = (
            self.finish
            if cmd is None
            else [*self.tok.encode(ct.format_tool_call("bash", {"command": cmd})), self.tok.eos_id]
        )
        if len(ids) > max_tokens:  # as an engine would: cut at the cap, no end of turn
            return ids[:max_tokens], [0.0] * max_tokens, "length"
        return ids, [0.0] * len(ids), "stop"  # the script's choice has probability 1


@contextlib.contextmanager
def scripted_engine(script: ReadoutScript, max_model_len: int) -> Iterator[str]:
    """The script behind a vLLM-shaped HTTP server on loopback (uvicorn in a thread); its URL."""
    port = free_port()
    app = make_app(max_model_len, served_name="policy", replier=script)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True, name="scripted-engine")
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise ConfigError("the scripted engine did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        t.join(10)


def _sample(ids: list[int], mask: list[int], group_id: str) -> list[Sample]:
    zeros = [0.0] * len(ids)
    return (
        [Sample(token_ids=ids, loss_mask=mask, logprobs=zeros, advantages=zeros, group_id=group_id)]
        if any(mask)
        else []
    )


def program_samples(trajs: list[Trajectory], eos: int) -> list[Sample]:
    """One sample per program segment: every reply the script ended (its ids and end of turn)
    is loss, the prompts and observations between them context. A segment's turns extend each
    other token for token (the gateway's guarantee), so a program trains as one sequence."""
    out: list[Sample] = []
    for t in trajs:
        for seg in t.segments:
            ids: list[int] = []
            mask: list[int] = []
            for turn in seg.turns:  # each extends the last (``Segment`` validates it)
                shown = turn.prompt_ids[len(ids) :]
                ended = turn.finish_reason == FinishReason.STOP and turn.completion_ids[-1:] == [eos]
                ids = [*ids, *shown, *turn.completion_ids]
                mask = [*mask, *[0] * len(shown), *[int(ended)] * len(turn.completion_ids)]
            out += _sample(ids, mask, t.group_id)
    return out


async def scripted_programs(cfg: Config, root: Path, tasks: list[Task], base_dir: Path) -> list[Trajectory]:
    """``sft.demos`` programs of the CLI against the script, recorded under ``root`` (the config
    checked the family and the profile's bash tool)."""
    assert cfg.agent.profile is not None and cfg.tasks.train.family in SCRIPTED_FAMILIES
    tok = FastTokenizer(base_dir)
    finish = finish_ids(tok, load_profile(cfg.agent.profile).finish)
    script = ReadoutScript(tok, finish, cfg.sft.mistake_prob, cfg.run.seed)
    rng = random.Random(cfg.run.seed)
    chosen = [tasks[rng.randrange(len(tasks))] for _ in range(cfg.sft.demos)]
    with scripted_engine(script, cfg.engine.max_model_len) as url:
        engine = RemoteFenced(url, name="engine0", max_model_len=cfg.engine.max_model_len, policy_version=0)
        fleet = EngineFleet([], [engine], base_dir, 0)
        async with open_services(cfg, root, base_dir, 0, fleet=fleet) as svc:
            runner = LocalRunner(svc, cfg.agent.timeout_s)
            trajs = list(
                await asyncio.gather(
                    *(
                        run_program(svc, runner, t, f"sft-{i}", cfg.run.temperature)
                        for i, t in enumerate(chosen)
                    )
                )
            )
    passed = sum(t.outcome is not None and bool(t.outcome.passed) for t in trajs)
    log.info(
        "sft scripted programs=%d turns=%d first_reply_guess=%d read=%d passed=%d",
        len(trajs),
        sum(t.num_turns for t in trajs),
        script.guesses,
        script.reads,
        passed,
    )
    return trajs


async def scripted_warm_start(tasks: list[Task], base_dir: Path, run_dir: Path, cfg: Config) -> Path:
    """The SFT model dir under ``RUN/sft`` (made once; a resumed run reuses it)."""
    out_root = run_dir / "sft"
    if (done := finished_warm_start(out_root)) is not None:
        return done
    trajs = await scripted_programs(cfg, out_root, tasks, base_dir)
    samples = program_samples(trajs, FastTokenizer(base_dir).eos_id)
    if not samples:
        raise ConfigError(
            f"{cfg.agent.profile} made no complete turn against the script: nothing to warm start on"
        )
    return await train_demonstrations(samples, base_dir, out_root, cfg)
