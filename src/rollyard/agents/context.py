"""Context-management policies: pure functions over an OpenAI-style message list.

Forge models context management as an agent action, so each rewrite the loop applies is also
returned as an explicit ``CONTEXT_REWRITE`` event (the gateway separately sees, token-wise,
that the next prompt no longer extends the previous one and starts a new segment).
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Message = dict[str, Any]
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class PolicyKind(StrEnum):
    DISCARD_ALL = "discard_all"  # MiniMax M2.5: over a fraction of the context, keep system + task
    KEEP_FIRST_LAST = "keep_first_last"  # M2.1: keep the first and last k assistant turns
    DROP_THINKING = "drop_thinking"  # remove reasoning from earlier assistant turns


class ContextPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PolicyKind
    fraction: float | None = Field(default=0.3, gt=0.0, le=1.0)  # trigger; None: always
    k: int = Field(default=5, ge=1)


def estimate_tokens(messages: list[Message]) -> int:
    """A rough count (4 characters per token) for when no usage figure is known."""
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4


def _head_len(messages: list[Message]) -> int:
    """How many leading messages are the system prompt(s) plus the task (first user message)."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return i + 1
    return len(messages)


def _turns(messages: list[Message]) -> list[list[Message]]:
    """Group the messages after the head into turns: an assistant message and what follows it."""
    turns: list[list[Message]] = []
    for m in messages[_head_len(messages) :]:
        if m.get("role") == "assistant" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def discard_all(messages: list[Message]) -> list[Message]:
    return messages[: _head_len(messages)]


def keep_first_last(messages: list[Message], k: int) -> list[Message]:
    turns = _turns(messages)
    if len(turns) <= 2 * k:
        return messages
    kept = turns[:k] + turns[-k:]
    return messages[: _head_len(messages)] + [m for t in kept for m in t]


def drop_thinking(messages: list[Message]) -> list[Message]:
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            m = {k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning")}
            if isinstance(m.get("content"), str):
                m["content"] = _THINK.sub("", m["content"])
        out.append(m)
    return out


NOTE_PREFIX = "[context compacted"


def with_note(messages: list[Message], policy: PolicyKind, removed: int, count: int) -> list[Message]:
    """Tell the model its history was compacted: a user message right after the task (replacing
    an earlier note). It sits inside the history, so the next request is a rewrite the gateway
    renders fresh (new segment; with ``drop_thinking`` the engine no longer sees the removed
    reasoning, which a plain omission would not achieve: the gateway reuses ids verbatim). The
    count keeps two compactions in a row distinct."""
    head = _head_len(messages)
    rest = messages[head:]
    if rest and rest[0].get("role") == "user" and str(rest[0].get("content", "")).startswith(NOTE_PREFIX):
        rest = rest[1:]
    what = (
        "earlier reasoning was removed"
        if policy is PolicyKind.DROP_THINKING
        else f"{removed} messages removed"
    )
    note = {"role": "user", "content": f"{NOTE_PREFIX} #{count} by {policy.value}: {what}]"}
    return [*messages[:head], note, *rest]


def apply_policy(
    policy: ContextPolicy, messages: list[Message], tokens: int, context_limit: int | None
) -> list[Message]:
    """The rewritten list (the same list object when the policy does not fire)."""
    below = context_limit is None or tokens <= (policy.fraction or 0.0) * context_limit
    if policy.fraction is not None and below:
        return messages
    if policy.kind is PolicyKind.DISCARD_ALL:
        new = discard_all(messages)
    elif policy.kind is PolicyKind.KEEP_FIRST_LAST:
        new = keep_first_last(messages, policy.k)
    else:
        new = drop_thinking(messages)
    return messages if new == messages else new
