"""The one internal request type every API dialect is parsed into, and the result it yields.

Routes translate their dialect to a ``ChatRequest`` at the edge and format a ``ChatResult``
back; the renderer, scheduler and recorder never see a dialect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from rollyard.core.json_text import UNREADABLE, read_json
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import TopLogprobs

Role = Literal["system", "user", "assistant", "tool"]
# json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False), its encoder made
# once: the history comparison dumps every tool call's arguments each turn (~1 us saved each).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall:
    """A function call; ``arguments`` is the parsed object, or the raw string when it is not JSON."""

    name: str
    arguments: dict[str, Any] | str
    id: str = ""

    def canonical(self) -> tuple[str, str]:
        """Name and argument JSON with sorted keys and no whitespace: SDK echoes compare equal."""
        args = self.arguments
        if isinstance(args, str):
            text, args = args, read_json(args) if args.strip() else {}
            if args is UNREADABLE:  # kept as text by parse_arguments too
                return self.name, text.strip()
        return self.name, _CANONICAL_JSON.encode(args)

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Message:
    """A chat message in normalized form (``developer`` is already ``system``)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    tool_call_id: str | None = None

    def canonical(self) -> tuple[Any, ...]:
        """What must match for an echoed message to count as the same one.

        Ignored: tool-call ids, argument whitespace and key order, None vs "" content,
        surrounding whitespace of assistant text, and reasoning the client did not echo back.

        Kept once made: a conversation state's messages are compared with the next request's
        on every turn, each tool call's arguments re-dumped as sorted JSON; a 100-message
        history cost ~450 us of the event loop per turn, half of it for the state's side.
        """
        made: tuple[Any, ...] | None = self.__dict__.get("_canonical")
        if made is None:
            text = self.content.strip() if self.role == "assistant" else self.content
            made = (self.role, text, tuple(c.canonical() for c in self.tool_calls))
            object.__setattr__(self, "_canonical", made)  # not a field: eq, hash, repr ignore it
        return made

    def same_as_returned(self, returned: Message) -> bool:
        """True when this (echoed) message is the assistant message the gateway returned."""
        if self.canonical() != returned.canonical():
            return False
        return self.reasoning is None or (self.reasoning.strip() == (returned.reasoning or "").strip())

    def to_template(self) -> dict[str, Any]:
        """The OpenAI-shaped dict the chat template renders."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {
                    "function": {
                        "name": c.name,
                        "arguments": c.arguments if isinstance(c.arguments, dict) else {},
                    }
                }
                for c in self.tool_calls
            ]
        if self.reasoning:
            d["reasoning_content"] = self.reasoning
        return d


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_template(self) -> dict[str, Any]:
        return {"type": "function", "function": self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


ToolChoice = Literal["auto", "none", "required"]


@dataclass
class ChatRequest:
    """One model call, whatever API it came in through."""

    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    tool_name: str | None = None  # a forced function (tool_choice naming one)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per token the client asked to see (never recorded)
    stream: bool = False
    model: str = ""
    api: str = "openai_chat"
    response_id: str = ""  # set by a route that must announce the id before the answer exists
    ignored: dict[str, Any] = field(default_factory=dict)  # fields accepted but not honoured

    def requested_sampling(self) -> dict[str, Any]:
        d = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p}
        d.update({"top_k": self.top_k, "seed": self.seed})
        return {k: v for k, v in d.items() if v is not None}


@dataclass
class ChatResult:
    """The assistant's answer plus the numbers every dialect reports."""

    message: Message
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    malformed_tool_call: bool = False
    request_id: str = ""
    created: int = 0
    model: str = ""
    completion_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)  # of the sampled tokens
    completion_top_logprobs: TopLogprobs | None = None  # when the request asked for them
    engine_s: float = 0.0  # time in the engine call
    gateway_s: float = 0.0  # time in the gateway outside it (lock, render, queue, record)

    def timing_headers(self) -> dict[str, str]:
        """``Server-Timing``: lets a client split its latency into engine time and gateway time."""
        engine, own = 1000 * self.engine_s, 1000 * self.gateway_s
        return {"server-timing": f"engine;dur={engine:.2f}, gateway;dur={own:.2f}"}

    @property
    def stop_kind(self) -> Literal["stop", "length", "tool_calls"]:
        if self.finish_reason == FinishReason.LENGTH:
            return "length"
        return "tool_calls" if self.message.tool_calls else "stop"
