"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``) to and from ``ChatRequest``.

Tolerated and recorded as ignored: ``thinking``, ``cache_control`` (inside blocks, dropped),
``context_management``, ``output_config``, ``metadata``, ``stop_sequences``, ``anthropic-beta``
headers and ``?beta=true``. ``system``-role entries inside ``messages`` become system messages.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from rollyard.core.errors import InvalidRequest
from rollyard.core.ids import wire_id
from rollyard.core.program import Program
from rollyard.gateway.bodies import MessagesBody, ignored_fields
from rollyard.gateway.bodies.anthropic import (
    IGNORED,
    Block,
    TextBlock,
)
from rollyard.gateway.bodies.anthropic import Tool as AnthropicTool
from rollyard.gateway.edge import FastJSONResponse, caller, gateway, text_of, tool_call
from rollyard.gateway.model_route import ModelRoute
from rollyard.gateway.sse import SLOT, Frame, event, primed, sse_response
from rollyard.gateway.streaming import StreamedText
from rollyard.gateway.types import ChatRequest, ChatResult, Message, Tool

router = APIRouter(route_class=ModelRoute)


def _user(blocks: list[Block], where: str) -> list[Message]:
    """Tool results become tool messages (in order); text blocks one user message."""
    out: list[Message] = []
    text: list[TextBlock] = []
    for i, b in enumerate(blocks):
        if b["type"] == "tool_result":
            body = text_of(b.get("content"), f"{where}[{i}].content")
            if b.get("is_error"):
                body = f"[error] {body}"
            out.append(Message("tool", body, tool_call_id=b.get("tool_use_id")))
        elif b["type"] == "text":
            text.append(b)
        else:
            raise InvalidRequest(f"{where}[{i}]: block type {b['type']!r} is not supported in a user message")
    if text:
        out.append(Message("user", text_of(text, where)))
    return out


def _assistant(blocks: list[Block], where: str) -> Message:
    text, calls, reasoning = [], [], None
    for i, b in enumerate(blocks):
        kind = b["type"]
        if kind == "text":
            text.append(b["text"])  # type: ignore[typeddict-item]
        elif kind == "tool_use":
            calls.append(tool_call(b["name"], b.get("input"), b.get("id")))  # type: ignore[typeddict-item]
        elif kind == "thinking":
            reasoning = b["thinking"]  # type: ignore[typeddict-item]
        elif kind == "redacted_thinking":
            continue
        else:
            raise InvalidRequest(
                f"{where}[{i}]: block type {kind!r} is not supported in an assistant message"
            )
    return Message("assistant", "".join(text), tuple(calls), reasoning)


def parse_messages(body: MessagesBody) -> list[Message]:
    """The system prompt, then the messages (those of the prefix the body extends are the
    previous body's own: ``Body.parsed_messages``)."""
    system = [Message("system", text_of(body.system, "system"))] if body.system else []
    return system + body.parsed_messages(_parse_raw)


def _parse_raw(raw: list[Any], start: int) -> list[Message]:
    out: list[Message] = []
    for i, m in enumerate(raw, start):
        where = f"messages[{i}].content"
        blocks: list[Block] = (
            [TextBlock(type="text", text=content)] if isinstance(content := m["content"], str) else content
        )
        if m["role"] == "user":
            out += _user(blocks, where)
        elif m["role"] == "assistant":
            out.append(_assistant(blocks, where))
        else:
            out.append(Message("system", text_of(blocks, where)))
    return out


def parse_tools(raw: list[AnthropicTool] | None) -> list[Tool]:
    """Custom tools; server tools (web_search, bash_20250124, ...) cannot run here and are skipped."""
    return [
        Tool(t["name"], t.get("description") or "", t.get("input_schema") or {})  # type: ignore[typeddict-item]
        for t in raw or []
        if t.get("type", "custom") == "custom"
    ]


def to_request(body: MessagesBody, request: Request) -> ChatRequest:
    if not body.messages:
        raise InvalidRequest("messages must not be empty")
    tools = parse_tools(body.tools)
    req = ChatRequest(
        messages=parse_messages(body),
        tools=tools,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stream=bool(body.stream),
        model=body.model,
        api="anthropic",
    )
    tc = body.tool_choice
    kind = tc["type"] if tc is not None else "auto"
    if kind == "any":
        req.tool_choice = "required"
    elif kind == "tool":
        req.tool_name = tc["name"]  # type: ignore[index, typeddict-item]
    elif kind == "none":
        req.tool_choice = "none"
    req.ignored = ignored_fields(body, IGNORED)
    unknown = body.unknown_fields()
    if unknown:
        req.ignored["unknown_fields"] = unknown
    if request.headers.get("anthropic-beta"):
        req.ignored["anthropic-beta"] = request.headers["anthropic-beta"][:256]
    if len(tools) != len(body.tools or []):
        req.ignored["server_tools"] = [
            t.get("name", "")[:64] for t in body.tools or [] if t.get("type", "custom") != "custom"
        ][:32]
    return req


def _stop_reason(r: ChatResult) -> str:
    return {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}[r.stop_kind]


def _content(r: ChatResult) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if r.message.reasoning:
        blocks.append({"type": "thinking", "thinking": r.message.reasoning, "signature": ""})
    if r.message.content or not r.message.tool_calls:
        blocks.append({"type": "text", "text": r.message.content})
    for c in r.message.tool_calls:
        args = c.arguments if isinstance(c.arguments, dict) else {}
        blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
    return blocks


def _usage(r: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": r.prompt_tokens,
        "output_tokens": r.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": r.cached_tokens,
    }


def to_body(r: ChatResult) -> dict[str, Any]:
    return {
        "id": f"msg_{r.request_id.removeprefix('resp_')}",
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": _content(r),
        "stop_reason": _stop_reason(r),
        "stop_sequence": None,
        "usage": _usage(r),
    }


async def _frames(
    items: AsyncIterator[StreamedText | ChatResult], model: str, prompt_tokens: int
) -> AsyncIterator[str]:
    msg = {
        "id": wire_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    yield event({"type": "message_start", "message": msg}, "message_start")
    text: Frame | None = None  # the text block's delta frame, once the block is open
    sent = ""
    index = 0
    async for item in items:
        if isinstance(item, StreamedText):
            async for piece in item:
                if text is None:
                    block = {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                    yield event(block, "content_block_start")
                    delta = {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": SLOT},
                    }
                    text = Frame(delta, "content_block_delta")
                sent += piece
                yield text.fill(piece)
            continue
        r = item
        blocks = _content(r)
        if text is not None:
            rest = r.message.content[len(sent) :] if r.message.content.startswith(sent) else ""
            if rest:
                yield text.fill(rest)
            yield event({"type": "content_block_stop", "index": index}, "content_block_stop")
            index += 1
            blocks = [b for b in blocks if b["type"] != "text"]
        for b in blocks:
            yield event(_start(b, index), "content_block_start")
            for d in _deltas(b):
                yield event(
                    {"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"
                )
            yield event({"type": "content_block_stop", "index": index}, "content_block_stop")
            index += 1
        delta = {"stop_reason": _stop_reason(r), "stop_sequence": None}
        yield event({"type": "message_delta", "delta": delta, "usage": _usage(r)}, "message_delta")
        yield event({"type": "message_stop"}, "message_stop")


def _start(block: dict[str, Any], index: int) -> dict[str, Any]:
    empty = {"text": {"text": ""}, "thinking": {"thinking": "", "signature": ""}, "tool_use": {"input": {}}}
    head = {k: v for k, v in block.items() if k in ("type", "id", "name")}
    return {"type": "content_block_start", "index": index, "content_block": {**head, **empty[block["type"]]}}


def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    if block["type"] == "thinking":
        return [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": ""},
        ]
    return [{"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}]


@router.post("/messages", response_model=None)
async def messages(body: MessagesBody, request: Request, program: Program = Depends(caller)) -> Response:
    """Anthropic Messages; streamed when ``stream`` is true."""
    gw = gateway(request)
    req = to_request(body, request)
    if not req.stream:
        result = await gw.chat(program, req)
        return FastJSONResponse(to_body(result), headers=result.timing_headers())
    model = req.model or gw.model_name
    prompt_tokens = await gw.count_tokens(program, req)
    items = await primed(gw.chat_stream(program, req))
    return sse_response(request.url.path, _frames(items, model, prompt_tokens), True, items)


@router.post("/messages/count_tokens")
async def count_tokens(
    body: MessagesBody, request: Request, program: Program = Depends(caller)
) -> dict[str, int]:
    """Prompt tokens this request would have now (reusing the program's previous ids when it extends)."""
    gw = gateway(request)
    return {"input_tokens": await gw.count_tokens(program, to_request(body, request))}
