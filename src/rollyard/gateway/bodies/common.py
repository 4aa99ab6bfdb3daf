"""Shared pieces of the typed request bodies: sampling ranges, tagged unions, bounded extras.

Why typed: a body that does not match its API's shape must be a 400 in that API's format,
never a crash deep in a handler, and ``/openapi.json`` must describe the real shapes so
schema-driven fuzzers reach them. Nested objects ignore fields they do not know (SDKs add
``cache_control``, ``annotations``, ``status``...); top-level unknown fields are allowed and
recorded by name only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Annotated, Any, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Strict
from typing_extensions import TypedDict

# Scalars are strict, as the APIs imitated are: ``"8"`` is no integer, ``"yes"`` or ``1`` no
# boolean (pydantic's lax mode took both). A float field takes an integer (JSON has one number
# type); an integer field takes no float, not even ``8.0``.
Bool = Annotated[bool, Strict()]
StrictInt = Annotated[int, Strict()]

# The ranges vLLM's SamplingParams accepts: a value outside them never reaches the engine.
MaxTokens = Annotated[int, Strict(), Field(ge=1, le=2**31 - 1)]
Temperature = Annotated[float, Strict(), Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Strict(), Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Strict(), Field(ge=-1, le=2**31 - 1)]
Seed = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]
Penalty = Annotated[float, Strict(), Field(ge=-2.0, le=2.0)]
Name = Annotated[str, Field(min_length=1, max_length=256)]

MAX_UNKNOWN_FIELDS = 32  # names recorded per request; the rest are counted
MAX_RECORDED_VALUE = 512  # bytes of an ignored field's JSON kept in the journal


class Part(TypedDict):
    """A nested object: unknown fields are dropped, known ones typed.

    A TypedDict, not a model: validated in pydantic-core into plain dicts, ~2.5x faster than
    building a model instance per message and part (a long agent conversation has hundreds).
    """


class OutputFormat(TypedDict):
    """An output format (``response_format``, Responses' ``text.format``, Anthropic's
    ``output_config.format``): accepted and not honoured, but its ``type`` must be a string, so
    ``{"type": 5}`` is a 400 like any other mistyped field. Other keys (``json_schema``...) are
    kept for the journal's record of what was ignored."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    type: str


class FormatHolder(TypedDict):
    """An object whose optional ``format`` is an ``OutputFormat`` (other keys kept as given)."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    format: NotRequired[OutputFormat]


# (body, the prefix it extended, the prefix it leaves), for the request being served: a context
# variable (each request is a task of its own), not a private attribute, which doubled the
# validation of a small body (~2.8 us: pydantic initializes private attributes per instance)
_PREFIXES: ContextVar[tuple[Any, Any, Any] | None] = ContextVar("body_prefixes", default=None)


class Body(BaseModel):
    """A top-level request body: unknown fields are kept (then recorded by name only)."""

    model_config = ConfigDict(extra="allow")

    def unknown_fields(self) -> list[str]:
        return bounded_names(self.model_extra or {})

    def set_prefixes(self, known: Any, made: Any) -> None:
        """The prefix of the program's previous body this one extended, and the one it leaves
        (``gateway.body_prefix``); set by the model route for the body it hands its endpoint."""
        _PREFIXES.set((self, known, made))

    def parsed_messages(self, parse: Callable[[list[Any], int], list[Any]]) -> list[Any]:
        """``parse(messages, first_index)`` of the body's messages, those of the prefix it extends
        taken as they were made for the previous body (the same objects: a frozen message is
        compared with the conversation's by identity first); the result is kept for the next."""
        messages: list[Any] = getattr(self, "messages", [])
        hint = _PREFIXES.get()
        known, made = (hint[1], hint[2]) if hint is not None and hint[0] is self else (None, None)
        n = len(known.messages) if known is not None and known.parsed is not None else 0
        out = known.parsed + parse(messages[n:], n) if n else parse(messages, 0)
        if made is not None:
            made.parsed = out
        return out


def tag(key: str, default: str | None = None, known: Iterable[str] = (), other: str | None = None) -> Any:
    """A discriminator on ``key`` (``default`` when absent); tags outside ``known`` map to ``other``.

    Non-string tags give None, which pydantic reports as a 400 (a list as a tag must not crash).
    """
    names = frozenset(known)

    def get(v: Any) -> str | None:
        t = v.get(key, default) if isinstance(v, dict) else getattr(v, key, default)
        if not isinstance(t, str):
            return None
        if other is not None and names and t not in names:
            return other
        return t

    return Discriminator(get)


def bounded_names(extra: dict[str, Any]) -> list[str]:
    names = sorted(k[:64] for k in extra)
    if len(names) > MAX_UNKNOWN_FIELDS:
        return [*names[:MAX_UNKNOWN_FIELDS], f"... {len(names) - MAX_UNKNOWN_FIELDS} more"]
    return names


def bounded_value(v: Any) -> Any:
    """An ignored field's value for the journal: itself when small, else its size."""
    if isinstance(v, BaseModel):
        v = v.model_dump(mode="json", exclude_none=True)
    text = json.dumps(v, ensure_ascii=False, default=str)
    return v if len(text) <= MAX_RECORDED_VALUE else f"<{len(text)} bytes>"


def ignored_fields(
    body: BaseModel, names: Iterable[str], to_value: Callable[[Any], Any] = bounded_value
) -> dict[str, Any]:
    """The fields a client set that this gateway accepts but does not honour (bounded)."""
    out = {}
    for name in names:
        v = getattr(body, name, None)
        if v is not None and name in body.model_fields_set:
            out[name] = to_value(v)
    return out
