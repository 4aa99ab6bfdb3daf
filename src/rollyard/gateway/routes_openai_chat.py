"""OpenAI Chat Completions (``/v1/chat/completions``), translated to and from ``ChatRequest``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from rollyard.core.errors import InvalidRequest
from rollyard.core.ids import wire_id
from rollyard.core.program import Program
from rollyard.gateway.bodies import ChatCompletionBody, ignored_fields
from rollyard.gateway.bodies.openai_chat import (
    IGNORED,
    ChatMessage,
    ChatTool,
)
from rollyard.gateway.edge import FastJSONResponse, caller, gateway, text_of, tool_call
from rollyard.gateway.logprobs import token_logprobs
from rollyard.gateway.model_route import ModelRoute
from rollyard.gateway.sse import SLOT, Frame, event, primed, sse_response
from rollyard.gateway.streaming import StreamedText
from rollyard.gateway.tokenizer import Tokenizer
from rollyard.gateway.types import ChatRequest, ChatResult, Message, Tool, ToolCall

router = APIRouter(route_class=ModelRoute)

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(raw: list[ChatMessage], start: int = 0) -> list[Message]:
    """``raw`` as messages; ``start``: the index of the first in the body (for errors)."""
    out = []
    for i, m in enumerate(raw, start):  # once per new message each turn (body_prefix): kept lean
        content = m.get("content")
        if not isinstance(content, str):
            content = text_of(content, f"messages[{i}].content")
        calls: tuple[ToolCall, ...] = ()
        reasoning, call_id = None, None
        role = m["role"]
        if role == "assistant":
            tool_calls = m.get("tool_calls")
            if tool_calls:
                calls = tuple(
                    tool_call(c["function"]["name"], c["function"].get("arguments"), c.get("id"))
                    for c in tool_calls
                )
            reasoning = m.get("reasoning_content") or m.get("reasoning")
        elif role == "tool":
            call_id = m.get("tool_call_id")
        out.append(Message(_ROLES[role], content, calls, reasoning, call_id))  # type: ignore[arg-type]
    return out


def parse_tools(raw: list[ChatTool] | None) -> list[Tool]:
    tools = []
    for t in raw or []:  # function tools only: any other type is refused by the body model
        fn = t["function"]
        tools.append(Tool(fn["name"], fn.get("description") or "", fn.get("parameters") or {}))
    return tools


def to_request(body: ChatCompletionBody) -> ChatRequest:
    if not body.messages:
        raise InvalidRequest("messages must not be empty")
    if body.n not in (None, 1):
        raise InvalidRequest("n > 1 is not supported; send n separate requests")
    req = ChatRequest(
        messages=body.parsed_messages(parse_messages),
        tools=parse_tools(body.tools),
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stream=bool(body.stream),
        model=body.model,
        api="openai_chat",
    )
    tc = body.tool_choice
    if isinstance(tc, dict):
        req.tool_name = tc["function"]["name"]
    elif tc is not None:
        req.tool_choice = tc
    req.ignored = ignored_fields(body, IGNORED)
    if body.top_logprobs and not body.logprobs:  # OpenAI's rule: alternatives need logprobs
        req.ignored["top_logprobs"] = body.top_logprobs
    elif body.logprobs:
        req.top_logprobs = body.top_logprobs or 0
    unknown = body.unknown_fields()
    if unknown:
        req.ignored["unknown_fields"] = unknown
    return req


def _calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
        for c in result.message.tool_calls
    ]


def _usage(r: ChatResult) -> dict[str, Any]:
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
    }


def _logprobs(r: ChatResult, tok: Tokenizer) -> dict[str, Any]:
    """OpenAI's ``choice.logprobs``: the recorded ids and logprobs, with the ``top_logprobs``
    alternatives the request asked for."""
    return {"content": token_logprobs(r, tok), "refusal": None}


def to_body(r: ChatResult, logprobs: Tokenizer | None = None) -> dict[str, Any]:
    """``logprobs``: the tokenizer, when the client asked for them."""
    msg: dict[str, Any] = {"role": "assistant", "content": r.message.content or None}
    if r.message.tool_calls:
        msg["tool_calls"] = _calls(r)
    if r.message.reasoning:
        msg["reasoning_content"] = r.message.reasoning
    return {
        "id": f"chatcmpl-{r.request_id}",
        "object": "chat.completion",
        "created": r.created,
        "model": r.model,
        "choices": [
            {
                "index": 0,
                "message": msg,
                "finish_reason": r.stop_kind,
                "logprobs": _logprobs(r, logprobs) if logprobs else None,
            }
        ],
        "usage": _usage(r),
    }


async def _frames(
    items: AsyncIterator[StreamedText | ChatResult],
    model: str,
    include_usage: bool,
    logprobs: Tokenizer | None = None,
) -> AsyncIterator[str]:
    cid, created = wire_id("chatcmpl-"), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    # The role's event goes out with the first frame, and the ones that end the stream together:
    # a streamed request's writes are one per text piece and one more (each write is ~3% of a
    # short stream's cost to the gateway, as to any relay).
    role = event(chunk({"role": "assistant", "content": ""}))
    text = Frame(chunk({"content": SLOT}))
    sent = ""
    async for item in items:
        if isinstance(item, StreamedText):
            async for piece in item:
                sent += piece
                yield role + text.fill(piece)
                role = ""
            continue
        r = item
        end = [role]
        if r.message.reasoning:
            end.append(event(chunk({"reasoning_content": r.message.reasoning})))
        rest = r.message.content[len(sent) :] if r.message.content.startswith(sent) else ""
        if rest:
            end.append(event(chunk({"content": rest})))
        for i, c in enumerate(_calls(r)):
            end.append(event(chunk({"tool_calls": [{"index": i, **c}]})))
        if logprobs:  # the whole completion's, once its ids are known (clients concatenate)
            frame = chunk({})
            frame["choices"][0]["logprobs"] = _logprobs(r, logprobs)
            end.append(event(frame))
        end.append(event(chunk({}, r.stop_kind)))
        if include_usage:
            end.append(event({**chunk({}), "choices": [], "usage": _usage(r)}))
        end.append(event("[DONE]"))
        yield "".join(end)
        return
    yield role + event("[DONE]")


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionBody, request: Request, program: Program = Depends(caller)
) -> Response:
    """OpenAI Chat Completions; streamed when ``stream`` is true."""
    gw = gateway(request)
    req = to_request(body)
    tok = gw.renderer.tok if body.logprobs else None
    if not req.stream:
        result = await gw.chat(program, req)
        return FastJSONResponse(to_body(result, tok), headers=result.timing_headers())
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    items = await primed(gw.chat_stream(program, req))
    frames = _frames(items, req.model or gw.model_name, include_usage, tok)
    return sse_response(request.url.path, frames, False, items)
