"""Rewards by name and by configuration: r = alpha * process + beta * speed + outcome.

A term is a function registered under a name and a kind. Outcome and speed terms return one
number per trajectory; process terms return one number per turn, so the same scores also feed
turn-level reward-to-go. Terms see the whole group, because speed is relative to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.errors import DataError
from rollyard.core.trajectory import Trajectory
from rollyard.rl import reward_terms  # noqa: F401  (registers the built-in terms)
from rollyard.rl.reward_base import RewardContext, TermKind, get_reward


class TermSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class JudgeSettings(BaseModel):
    """Where the ``judge`` term asks: any OpenAI-compatible base URL, or ``gateway`` for the
    run's own gateway (the policy judges itself, as a program of its own that is never trained)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = "gateway"
    model: str = "policy"
    api_key: str | None = Field(default=None, repr=False)
    scale: tuple[float, float] = (0.0, 10.0)
    temperature: float = Field(default=0.0, ge=0.0)
    max_tokens: int = Field(default=256, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    # A reply without a readable score: ``fail`` the group (default), or ``zero``: score 0 and
    # count it in the step's ``judge_unreadable`` metric (for judges too weak to follow the format).
    on_unreadable: Literal["fail", "zero"] = "fail"
    # The judge answers by a forced ``score`` tool call whose one argument is an integer of the
    # scale (the gateway's tool grammar): any model, even a random one, gives a readable score.
    # The reply then holds no reasoning; ``max_tokens`` must cover the call: up to one token per
    # character of it (~65 with the wrapper), as the grammar admits any tokenization.
    forced_score: bool = False

    @model_validator(mode="after")
    def _integer_scale(self) -> JudgeSettings:
        if self.forced_score and not 1 <= len(self.score_values()) <= 101:
            raise ValueError(f"forced_score needs 1 to 101 integers on the scale {self.scale}")
        return self

    def score_values(self) -> list[int]:
        lo, hi = self.scale
        return list(range(math.ceil(lo), math.floor(hi) + 1)) if hi >= lo else []

    def score_tool(self) -> dict[str, Any]:
        """The function a ``forced_score`` judge must call."""
        score = {"type": "integer", "enum": self.score_values()}
        params = {"type": "object", "properties": {"score": score}, "required": ["score"]}
        return {"type": "function", "function": {"name": "score", "parameters": params}}


class RewardConfig(BaseModel):
    """r = alpha * process + beta * speed + outcome; an absent term contributes 0."""

    model_config = ConfigDict(extra="forbid")

    outcome: TermSpec = Field(default_factory=lambda: TermSpec(name="pass_fraction"))
    process: TermSpec | None = None
    speed: TermSpec | None = None
    alpha: float = 0.0
    beta: float = 0.0
    judge: JudgeSettings | None = None  # needed by the ``judge`` term

    @model_validator(mode="after")
    def _judge_endpoint(self) -> RewardConfig:
        names = [t.name for t in (self.outcome, self.process, self.speed) if t is not None]
        if "judge" in names and self.judge is None:
            raise ValueError("the 'judge' term needs rewards.judge (base_url, model)")
        return self


@dataclass(frozen=True)
class RewardBreakdown:
    """One trajectory's reward and where it came from. ``per_turn`` sums to ``total``: each
    turn carries alpha times its process score, the last turn also outcome + beta * speed."""

    total: float
    outcome: float
    process: float
    speed: float
    per_turn: list[float] = field(default_factory=list)

    @property
    def terms(self) -> dict[str, float]:
        return {"outcome": self.outcome, "process": self.process, "speed": self.speed}


def _finite(name: str, values: Sequence[float]) -> list[float]:
    out = [float(v) for v in values]
    if any(not math.isfinite(v) for v in out):
        raise DataError(f"reward term {name!r} produced a NaN or infinite value")
    return out


def score_group(
    trajectories: Sequence[Trajectory], config: RewardConfig, ctx: RewardContext | None = None
) -> list[RewardBreakdown]:
    """Score every trajectory of one group with the configured terms."""
    if not trajectories:
        raise DataError("cannot score an empty group")
    ctx = ctx or RewardContext()
    n = len(trajectories)
    out_term = get_reward(config.outcome.name, TermKind.OUTCOME)
    outcome = _finite(out_term.name, out_term.fn(trajectories, config.outcome.params, ctx))
    process_turns: list[list[float]] = [[0.0] * t.num_turns for t in trajectories]
    if config.process is not None:
        p = get_reward(config.process.name, TermKind.PROCESS)
        process_turns = [_finite(p.name, row) for row in p.fn(trajectories, config.process.params, ctx)]
        if [len(r) for r in process_turns] != [t.num_turns for t in trajectories]:
            raise DataError(f"process term {p.name!r} must give one value per turn")
    speed = [0.0] * n
    if config.speed is not None:
        s = get_reward(config.speed.name, TermKind.SPEED)
        speed = _finite(s.name, s.fn(trajectories, config.speed.params, ctx))
    if len(outcome) != n or len(speed) != n:
        raise DataError("a reward term returned the wrong number of values")
    result = []
    for i in range(n):
        per_turn = [config.alpha * p for p in process_turns[i]]
        tail = outcome[i] + config.beta * speed[i]
        if per_turn:
            per_turn[-1] += tail
        process = sum(process_turns[i])
        total = outcome[i] + config.alpha * process + config.beta * speed[i]
        result.append(RewardBreakdown(total, outcome[i], process, speed[i], per_turn))
    return result


def with_rewards(trajectories: Sequence[Trajectory], scores: Sequence[RewardBreakdown]) -> list[Trajectory]:
    """Copies of the trajectories with ``outcome.reward`` and ``reward_terms`` filled in."""
    if len(trajectories) != len(scores):
        raise DataError(f"{len(trajectories)} trajectories but {len(scores)} scores")
    out = []
    for t, s in zip(trajectories, scores, strict=True):
        if t.outcome is None:
            raise DataError(f"trajectory {t.id} has no outcome to attach a reward to")
        outcome = t.outcome.model_copy(update={"reward": s.total, "reward_terms": s.terms})
        out.append(t.model_copy(update={"outcome": outcome}))
    return out


def reward_to_go(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """G_t = sum_{k >= t} gamma^(k - t) r_k, for per-turn rewards r."""
    if not 0.0 <= gamma <= 1.0:
        raise DataError(f"discount gamma must be in [0, 1], got {gamma}")
    values = _finite("reward_to_go", rewards)
    out = [0.0] * len(values)
    acc = 0.0
    for t in range(len(values) - 1, -1, -1):
        acc = values[t] + gamma * acc
        out[t] = acc
    return out
