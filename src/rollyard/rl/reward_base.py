"""The reward-term registry and what terms may read: decoded turn text, a judge transcript, and
the context gathered before scoring. ``rewards`` (composition) and ``reward_terms`` (the
built-in terms) both import this module; neither imports the other's insides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.core.events import CompletionEvent, EventKind, ToolCallEvent, ToolResultEvent
from rollyard.core.trajectory import Trajectory, Turn


class TermKind(StrEnum):
    OUTCOME = "outcome"
    PROCESS = "process"
    SPEED = "speed"


def turn_text(trajectory: Trajectory, turn: Turn) -> str | None:
    """The decoded text of a turn: its ``COMPLETION`` events' text (reasoning included)."""
    parts = []
    for e in trajectory.events:
        if e.turn_index == turn.index and e.kind == EventKind.COMPLETION:
            c: CompletionEvent = e.payload
            parts += [p for p in (c.reasoning, c.text) if p]
    return "\n".join(parts) if parts else None


def transcript(trajectory: Trajectory) -> str:
    """What a judge reads: each turn's text, the tool calls it made and how they ended."""
    lines = []
    for turn in trajectory.turns:
        text = turn_text(trajectory, turn)
        if text:
            lines.append(f"assistant: {text}")
        for e in trajectory.events:
            if e.turn_index != turn.index:
                continue
            if e.kind == EventKind.TOOL_CALL:
                call: ToolCallEvent = e.payload
                lines.append(f"tool call: {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
            elif e.kind == EventKind.TOOL_RESULT:
                res: ToolResultEvent = e.payload
                status = "error" if res.is_error else "ok"
                code = f" exit={res.exit_code}" if res.exit_code is not None else ""
                lines.append(f"tool result: {res.name} {status}{code}")
    return "\n".join(lines)


@dataclass(frozen=True)
class RewardContext:
    """What terms need beyond the trajectories, gathered before scoring (terms stay pure and
    synchronous): judge scores by trajectory id, and the task's own completion-time baseline."""

    judged: Mapping[str, float] = field(default_factory=dict)
    baseline_s: float | None = None


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
