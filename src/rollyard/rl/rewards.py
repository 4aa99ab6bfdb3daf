"""Rewards by name and by configuration: r = alpha * process + beta * speed + outcome.

A term is a function registered under a name and a kind. Outcome and speed terms return one
number per trajectory; process terms return one number per turn, so the same scores also feed
turn-level reward-to-go. Terms see the whole group, because speed is relative to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import ConfigError, DataError
from rollyard.core.trajectory import Trajectory, Turn


class TermKind(StrEnum):
    OUTCOME = "outcome"
    PROCESS = "process"
    SPEED = "speed"


class Judge(Protocol):
    def score(self, text: str) -> float: ...


def event_text(trajectory: Trajectory, turn: Turn) -> str | None:
    """Default decoded text of a turn: ``data["completion_text"]`` of an event attached to it."""
    parts = [
        str(e.data["completion_text"])
        for e in trajectory.events
        if e.turn_index == turn.index and "completion_text" in e.data
    ]
    return "\n".join(parts) if parts else None


@dataclass(frozen=True)
class RewardContext:
    """What terms may need beyond the trajectories: decoded text and an optional judge."""

    text_of: Callable[[Trajectory, Turn], str | None] = event_text
    judge: Judge | None = None

    def transcript(self, trajectory: Trajectory) -> str:
        return "\n".join(t for t in (self.text_of(trajectory, turn) for turn in trajectory.turns) if t)


ScalarTerm = Callable[[Sequence[Trajectory], dict[str, Any], RewardContext], list[float]]
TurnTerm = Callable[[Sequence[Trajectory], dict[str, Any], RewardContext], list[list[float]]]


@dataclass(frozen=True)
class RegisteredTerm:
    name: str
    kind: TermKind
    fn: Callable[..., Any]


_REGISTRY: dict[str, RegisteredTerm] = {}


def register_reward(name: str, kind: TermKind | str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make a term available to configs under ``name``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ConfigError(f"reward term {name!r} is already registered")
        _REGISTRY[name] = RegisteredTerm(name, TermKind(kind), fn)
        return fn

    return wrap


def get_reward(name: str, kind: TermKind | str | None = None) -> RegisteredTerm:
    term = _REGISTRY.get(name)
    if term is None:
        raise ConfigError(f"unknown reward term {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    if kind is not None and term.kind != TermKind(kind):
        raise ConfigError(f"reward term {name!r} is a {term.kind} term, not {TermKind(kind)}")
    return term


def registered_rewards() -> dict[str, TermKind]:
    return {n: t.kind for n, t in sorted(_REGISTRY.items())}


class TermSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class RewardConfig(BaseModel):
    """r = alpha * process + beta * speed + outcome; an absent term contributes 0."""

    model_config = ConfigDict(extra="forbid")

    outcome: TermSpec = Field(default_factory=lambda: TermSpec(name="pass_fraction"))
    process: TermSpec | None = None
    speed: TermSpec | None = None
    alpha: float = 0.0
    beta: float = 0.0


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


# Register the built-in terms (they import this module, so this comes last).
from rollyard.rl import reward_terms as _builtin_terms  # noqa: E402, F401
