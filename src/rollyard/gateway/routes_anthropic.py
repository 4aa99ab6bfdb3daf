"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``) to and from ``ChatRequest``.

Tolerated and recorded as ignored: ``thinking``, ``cache_control`` (inside blocks, dropped),
``context_management``, ``output_config``, ``metadata``, ``stop_sequences``, ``anthropic-beta``
headers and ``?beta=true``. ``system``-role entries inside ``messages`` become system messages.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import InvalidRequest
from rollyard.core.program import Program
from rollyard.gateway.edge import caller, gateway, text_of, tool_call
from rollyard.gateway.service import TextDelta
from rollyard.gateway.sse import event, primed, sse_response
from rollyard.gateway.types import ChatRequest, ChatResult, Message, Tool

router = APIRouter()

_IGNORED = (
    "thinking context_management output_config metadata stop_sequences service_tier container mcp_servers"
)


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    stream: bool | None = False


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise InvalidRequest(f"{where} must be a string or a list of content blocks")
    return content


def _user(blocks: list[dict[str, Any]], where: str) -> list[Message]:
    """Tool results become tool messages (in order); text blocks one user message."""
    out: list[Message] = []
    text: list[dict[str, Any]] = []
    for i, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "tool_result":
            body = text_of(b.get("content"), f"{where}[{i}].content")
            if b.get("is_error"):
                body = f"[error] {body}"
            out.append(Message("tool", body, tool_call_id=b.get("tool_use_id")))
        elif kind == "text":
            text.append(b)
        else:
            raise InvalidRequest(f"{where}[{i}]: block type {kind!r} is not supported in a user message")
    if text:
        out.append(Message("user", text_of(text, where)))
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> Message:
    text, calls, reasoning = [], [], None
    for i, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text":
            text.append(b.get("text", ""))
        elif kind == "tool_use":
            calls.append(tool_call(b.get("name"), b.get("input"), b.get("id"), f"{where}[{i}]"))
        elif kind == "thinking":
            reasoning = b.get("thinking")
        elif kind == "redacted_thinking":
            continue
        else:
            raise InvalidRequest(
                f"{where}[{i}]: block type {kind!r} is not supported in an assistant message"
            )
    return Message("assistant", "".join(text), tuple(calls), reasoning)


def parse_messages(body: MessagesBody) -> list[Message]:
    out: list[Message] = []
    if body.system:
        out.append(Message("system", text_of(_blocks(body.system, "system"), "system")))
    for i, m in enumerate(body.messages):
        where = f"messages[{i}].content"
        role = m.get("role")
        blocks = _blocks(m.get("content", ""), where)
        if role == "user":
            out += _user(blocks, where)
        elif role == "assistant":
            out.append(_assistant(blocks, where))
        elif role == "system":
            out.append(Message("system", text_of(blocks, where)))
        else:
            raise InvalidRequest(f"messages[{i}].role must be user or assistant, not {role!r}")
    return out


def parse_tools(raw: list[dict[str, Any]] | None) -> list[Tool]:
    tools = []
    for i, t in enumerate(raw or []):
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise InvalidRequest(f"tools[{i}] needs a name")
        if "input_schema" not in t and t.get("type") not in (None, "custom"):
            continue  # server tools (web_search, bash_20250124, ...) cannot run here
        tools.append(Tool(t["name"], t.get("description") or "", t.get("input_schema") or {}))
    return tools


def to_request(body: MessagesBody, request: Request) -> ChatRequest:
    if not body.messages:
        raise InvalidRequest("messages must not be empty")
    req = ChatRequest(
        messages=parse_messages(body),
        tools=parse_tools(body.tools),
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stream=bool(body.stream),
        model=body.model,
        api="anthropic",
    )
    tc = body.tool_choice or {}
    kind = tc.get("type", "auto")
    if kind == "any":
        req.tool_choice = "required"
    elif kind == "tool":
        req.tool_name = tc.get("name")
    elif kind == "none":
        req.tool_choice = "none"
    elif kind != "auto":
        raise InvalidRequest(f"tool_choice.type must be auto, any, tool or none, not {kind!r}")
    extra = body.model_extra or {}
    req.ignored = {k: v for k, v in extra.items() if v is not None}
    if request.headers.get("anthropic-beta"):
        req.ignored["anthropic-beta"] = request.headers["anthropic-beta"]
    if len(parse_tools(body.tools)) != len(body.tools or []):
        req.ignored["server_tools"] = [t.get("name") for t in body.tools or [] if "input_schema" not in t]
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
    items: AsyncIterator[TextDelta | ChatResult], model: str, prompt_tokens: int
) -> AsyncIterator[str]:
    msg = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    yield event({"type": "message_start", "message": msg}, "message_start")
    text_open = False
    sent = ""
    index = 0
    async for item in items:
        if isinstance(item, TextDelta):
            if not text_open:
                block = {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
                yield event(block, "content_block_start")
                text_open = True
            sent += item.text
            delta = {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": item.text},
            }
            yield event(delta, "content_block_delta")
            continue
        r = item
        blocks = _content(r)
        if text_open:
            rest = r.message.content[len(sent) :] if r.message.content.startswith(sent) else ""
            if rest:
                delta = {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": rest},
                }
                yield event(delta, "content_block_delta")
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
        return JSONResponse(to_body(result), headers=result.timing_headers())
    model = req.model or gw.model_name
    prompt_tokens = gw.count_tokens(program, req)
    items = await primed(gw.chat_stream(program, req))
    return sse_response(request.url.path, _frames(items, model, prompt_tokens), True)


@router.post("/messages/count_tokens")
async def count_tokens(
    body: MessagesBody, request: Request, program: Program = Depends(caller)
) -> dict[str, int]:
    """Prompt tokens this request would have now (reusing the program's previous ids when it extends)."""
    gw = gateway(request)
    return {"input_tokens": gw.count_tokens(program, to_request(body, request))}
