"""A workload as YAML: how many agent programs, their turns, token counts, tool latencies,
GRPO groups, the RL loop around them and the engine failures to inject.

Every program's whole plan (turn count, prompt, each turn's output length, tool latency and
tool-result size) is drawn up front from a generator seeded by the workload seed and the
program's index, so every policy sees exactly the same programs, and a seeded run repeats.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollyard.core.errors import ConfigError
from rollyard.rl.buffer import BufferConfig

__all__ = ["Dist", "Failure", "ProgramPlan", "RLMode", "RLSpec", "Turn", "Workload", "load_workload"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Dist(_Model):
    """A distribution of positive numbers: ``const`` (value), ``uniform`` (low..high),
    ``lognormal`` (median, sigma: the long tail), ``exponential`` (mean); ``min``/``max`` clip."""

    dist: Literal["const", "uniform", "lognormal", "exponential"] = "const"
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    median: float = 1.0
    sigma: float = Field(default=1.0, ge=0)
    mean: float = Field(default=1.0, gt=0)
    min: float = 0.0
    max: float = math.inf

    @model_validator(mode="after")
    def _range(self) -> Dist:
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError("uniform needs low <= high")
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self

    def sample(self, rng: random.Random) -> float:
        if self.dist == "const":
            x = self.value
        elif self.dist == "uniform":
            x = rng.uniform(self.low, self.high)
        elif self.dist == "lognormal":
            x = self.median * math.exp(rng.gauss(0.0, self.sigma))
        else:
            x = rng.expovariate(1.0 / self.mean)
        return min(self.max, max(self.min, x))


class RLMode(StrEnum):
    NONE = "none"  # serving only: programs run, nobody trains
    SYNC = "sync"  # a step's groups all finish, then the trainer trains while engines idle
    ASYNC = "async"  # programs keep running while the trainer takes batches through the buffer


class RLSpec(_Model):
    mode: RLMode = RLMode.NONE
    batch_groups: int = Field(default=8, ge=1)  # groups per trainer step
    train_s: float = Field(default=30.0, ge=0)  # simulated seconds per trainer step
    buffer: BufferConfig = Field(
        default_factory=lambda: BufferConfig(window_fraction=0.3, group_whole=True, max_staleness=4)
    )


class Failure(_Model):
    engine: int = Field(ge=0)  # engine index
    at_s: float = Field(ge=0)
    down_s: float = Field(default=math.inf, gt=0)


class Workload(_Model):
    name: str
    description: str = ""
    programs: int = Field(ge=1)
    group_size: int = Field(default=1, ge=1)
    concurrency: int = Field(default=0, ge=0)  # programs in flight at once; 0 = all
    engines: int = Field(default=4, ge=1)
    profile: str = "cpu-tiny"
    gateway_capacity: int = Field(default=256, ge=1)  # concurrent requests the gateway sends an engine
    poll_s: float = Field(default=2.0, gt=0)  # the gateway's engine-stats poll
    seed: int = 0
    turns: Dist = Field(default_factory=lambda: Dist(value=1))
    prompt_tokens: Dist  # the task prompt (shared by a group)
    output_tokens: Dist
    # Seer's premise, that a GRPO group's samples have related lengths: with a spread of S
    # decades, a group draws each turn's longest answer from ``output_tokens`` and each member
    # gets that times 10**-U(0, S) (one member, at a random place, the longest itself); 0 draws
    # every program's answers independently, so a sibling says nothing about the others.
    group_spread: float = Field(default=0.0, ge=0, le=6)
    tool_tokens: Dist = Field(default_factory=Dist)  # appended to the context after each tool call
    tool_s: Dist = Field(default_factory=Dist)
    max_context: int = Field(default=32768, ge=16)
    retry_s: float = Field(default=1.0, ge=0)  # a client's wait before retrying a failed request
    divide_tokens: int = Field(default=0, ge=0)  # Seer's divided rollout: chunks of this many tokens
    rl: RLSpec = Field(default_factory=RLSpec)
    failures: list[Failure] = Field(default_factory=list)

    @model_validator(mode="after")
    def _groups(self) -> Workload:
        if self.programs % self.group_size:
            raise ValueError(f"programs ({self.programs}) not a multiple of group_size ({self.group_size})")
        if self.concurrency and self.concurrency < self.group_size:
            raise ValueError("concurrency must hold at least one whole group")
        for f in self.failures:
            if f.engine >= self.engines:
                raise ValueError(f"failure on engine {f.engine}, but there are {self.engines} engines")
        return self

    def plans(self) -> list[ProgramPlan]:
        """Every program's plan, the same for every policy."""
        out: list[ProgramPlan] = []
        for g in range(self.programs // self.group_size):
            grng = random.Random(f"{self.seed}:group:{g}")
            prompt = max(1, round(self.prompt_tokens.sample(grng)))
            longest = grng.randrange(self.group_size) if self.group_spread else -1
            for m in range(self.group_size):
                rng = random.Random(f"{self.seed}:program:{g}:{m}")
                spread = self.group_spread and m != longest  # no draw when off: plans stay as they were
                scale = 10 ** -rng.uniform(0, self.group_spread) if spread else 1.0
                out.append(self._plan(f"p{g}.{m}", f"g{g}", prompt, rng, scale))
        return out

    def _plan(self, pid: str, gid: str, prompt: int, rng: random.Random, scale: float) -> ProgramPlan:
        n = max(1, round(self.turns.sample(rng)))
        turns: list[Turn] = []
        context = min(prompt, self.max_context - 1)
        for i in range(n):
            if self.group_spread:  # the group's longest answer at this turn, scaled to this member
                top = self.output_tokens.sample(random.Random(f"{self.seed}:{gid}:turn:{i}"))
                drawn = max(self.output_tokens.min, top * scale)
            else:
                drawn = self.output_tokens.sample(rng)
            out = max(1, round(drawn))
            out = min(out, self.max_context - context)
            last = i == n - 1
            tool_s = 0.0 if last else self.tool_s.sample(rng)
            tool = 0 if last else max(0, round(self.tool_tokens.sample(rng)))
            if not last and context + out + tool >= self.max_context:
                last, tool_s, tool = True, 0.0, 0  # the context is full: the agent stops here
            turns.append(Turn(context, out, tool_s, tool))
            if last:
                break
            context += out + tool
        return ProgramPlan(pid, gid, self.group_size, turns)


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    output_tokens: int
    tool_s: float  # the tool call after this turn's answer (0 after the last)
    tool_tokens: int


@dataclass(frozen=True)
class ProgramPlan:
    id: str
    group_id: str
    group_size: int
    turns: list[Turn]
    start_s: float = 0.0  # its first request, after the run's start (a live trace's; drawn plans: 0)

    def new_tokens(self, turn: int) -> int:
        """Prompt tokens turn ``turn`` adds to the previous turn's prompt (its answer, the tool's
        result): what the gateway renders now; a first turn's whole prompt."""
        now = self.turns[turn].prompt_tokens
        return now if turn == 0 else max(0, now - self.turns[turn - 1].prompt_tokens)


def workload_names() -> list[str]:
    folder = resources.files("rollyard.sim") / "workloads"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_workload(name_or_path: str | Path, **overrides: object) -> Workload:
    """A shipped workload by name (``swe``, ``search``, ``math``) or a YAML file; ``overrides``
    replace top-level fields (the CLI's ``--engines``, ``--programs``, ``--seed``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"workload {path} does not exist")
        text, label = path.read_text(), str(path)
    else:
        if str(name_or_path) not in workload_names():
            known = ", ".join(workload_names())
            raise ConfigError(f"unknown workload {name_or_path!r}; a YAML file or one of: {known}")
        text = (resources.files("rollyard.sim") / "workloads" / f"{name_or_path}.yaml").read_text()
        label = f"builtin:{name_or_path}"
    try:
        raw = yaml.safe_load(text)
        if not isinstance(raw, dict):
            raise ConfigError(f"workload {label} is not a YAML mapping")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return Workload.model_validate(raw)
    except (ValidationError, yaml.YAMLError) as e:
        raise ConfigError(f"workload {label} is invalid: {e}") from None
