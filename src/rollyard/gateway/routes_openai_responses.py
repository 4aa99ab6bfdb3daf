"""OpenAI Responses (``/v1/responses``) to and from ``ChatRequest``.

Input items: messages (any role, ``developer`` = system), ``function_call`` and
``function_call_output``; ``reasoning`` items are folded into the next assistant message.
Tolerated and recorded as ignored: ``reasoning``, ``store``, ``prompt_cache_key``,
``parallel_tool_calls``, ``text``, ``truncation``, non-function tools (``web_search``, ...) and
``include`` entries other than ``message.output_text.logprobs``. That one is honoured: the
``output_text`` part carries every completion token's logprob and the ``top_logprobs``
alternatives asked for (streamed: in the ``output_text.done`` event and the final response;
text deltas carry none).
``previous_response_id`` works for the program's latest response (the gateway keeps it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from rollyard.core.ids import wire_id
from rollyard.core.program import Program
from rollyard.gateway.bodies import ResponsesBody, ignored_fields
from rollyard.gateway.bodies.responses import (
    IGNORED,
    TEXT_PARTS,
    InputItem,
)
from rollyard.gateway.edge import FastJSONResponse, caller, gateway, text_of, tool_call
from rollyard.gateway.logprobs import token_logprobs
from rollyard.gateway.model_route import ModelRoute
from rollyard.gateway.sse import SLOT, Frame, event, primed, sse_response
from rollyard.gateway.streaming import StreamedText
from rollyard.gateway.tokenizer import Tokenizer
from rollyard.gateway.types import ChatRequest, ChatResult, Message, Tool

router = APIRouter(route_class=ModelRoute)

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
LOGPROBS = "message.output_text.logprobs"


def parse_input(items: str | list[InputItem]) -> list[Message]:
    if isinstance(items, str):
        return [Message("user", items)]
    out: list[Message] = []
    reasoning: str | None = None
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.get("type", "message")
        if kind == "message":
            role = _ROLES[it["role"]]  # type: ignore[typeddict-item]
            text = text_of(it["content"], f"{where}.content", TEXT_PARTS)  # type: ignore[typeddict-item]
            if role == "assistant" and out and out[-1].role == "assistant" and not out[-1].content:
                prev = out.pop()  # function calls came first; keep one assistant message
                out.append(Message("assistant", text, prev.tool_calls, prev.reasoning))
            else:
                out.append(Message(role, text, reasoning=reasoning if role == "assistant" else None))  # type: ignore[arg-type]
            reasoning = None if role == "assistant" else reasoning
        elif kind == "function_call":
            call = tool_call(it["name"], it.get("arguments"), it.get("call_id"))  # type: ignore[typeddict-item]
            if out and out[-1].role == "assistant":
                prev = out.pop()
                out.append(Message("assistant", prev.content, (*prev.tool_calls, call), prev.reasoning))
            else:
                out.append(Message("assistant", "", (call,), reasoning))
            reasoning = None
        elif kind == "function_call_output":
            text = text_of(it["output"], f"{where}.output", TEXT_PARTS)  # type: ignore[typeddict-item]
            out.append(Message("tool", text, tool_call_id=it.get("call_id")))
        else:
            parts = it.get("summary") or it.get("content") or []
            reasoning = text_of(parts, f"{where}.summary", TEXT_PARTS) or None
    return out


def to_request(body: ResponsesBody, previous: list[Message]) -> ChatRequest:
    msgs = parse_input(body.input)
    if body.instructions:
        msgs.insert(0, Message("system", body.instructions))
    tools = [
        Tool(t["name"], t.get("description") or "", t.get("parameters") or {})  # type: ignore[typeddict-item]
        for t in body.tools or []
        if t["type"] == "function"
    ]
    skipped = [t["type"][:64] for t in body.tools or [] if t["type"] != "function"][:32]
    if previous and msgs and msgs[0].role == "system" and body.instructions:
        msgs = msgs[1:]  # instructions are already the first message of the stored conversation
    req = ChatRequest(
        messages=previous + msgs,
        tools=tools,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=bool(body.stream),
        model=body.model,
        api="openai_responses",
    )
    tc = body.tool_choice
    if isinstance(tc, dict):
        req.tool_name = tc["name"]
    elif tc is not None:
        req.tool_choice = tc
    req.ignored = ignored_fields(body, IGNORED)
    other = [x[:64] for x in body.include or [] if x != LOGPROBS][:16]
    if other:
        req.ignored["include"] = other
    if LOGPROBS in (body.include or []):
        req.top_logprobs = body.top_logprobs or 0
    elif body.top_logprobs:
        req.ignored["top_logprobs"] = body.top_logprobs
    unknown = body.unknown_fields()
    if unknown:
        req.ignored["unknown_fields"] = unknown
    if skipped:
        req.ignored["non_function_tools"] = skipped
    return req


def _output(r: ChatResult, tok: Tokenizer | None) -> list[dict[str, Any]]:
    """``tok``: the tokenizer, when the client asked for logprobs."""
    out: list[dict[str, Any]] = []
    if r.message.reasoning:
        summary = [{"type": "summary_text", "text": r.message.reasoning}]
        out.append({"type": "reasoning", "id": f"rs_{r.request_id[5:]}", "summary": summary})
    if r.message.content or not r.message.tool_calls:
        logprobs = token_logprobs(r, tok) if tok else []
        part = {"type": "output_text", "text": r.message.content, "annotations": [], "logprobs": logprobs}
        out.append(
            {
                "type": "message",
                "id": f"msg_{r.request_id[5:]}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for c in r.message.tool_calls:
        out.append(
            {
                "type": "function_call",
                "id": f"fc_{c.id.removeprefix('call_')}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments_json(),
                "status": "completed",
            }
        )
    return out


def _response(
    r: ChatResult | None,
    rid: str,
    model: str,
    req: ChatRequest,
    created: int,
    tok: Tokenizer | None = None,
) -> dict[str, Any]:
    done = r is not None
    incomplete = r is not None and r.stop_kind == "length"
    usage = None
    if r is not None:
        usage = {
            "input_tokens": r.prompt_tokens,
            "input_tokens_details": {"cached_tokens": r.cached_tokens},
            "output_tokens": r.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.prompt_tokens + r.completion_tokens,
        }
    tc = req.tool_choice if not req.tool_name else {"type": "function", "name": req.tool_name}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": _output(r, tok) if r is not None else [],
        "parallel_tool_calls": False,
        "tool_choice": tc,
        "tools": [{"type": "function", **t.to_dict(), "strict": False} for t in req.tools],
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_tokens,
        "text": {"format": {"type": "text"}},
        "usage": usage,
    }


async def _frames(
    items: AsyncIterator[StreamedText | ChatResult], req: ChatRequest, model: str, tok: Tokenizer | None
) -> AsyncIterator[str]:
    seq = 0
    created = int(time.time())

    def ev(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        return event({"type": kind, "sequence_number": seq - 1, **fields}, kind)

    rid = req.response_id
    yield ev("response.created", response=_response(None, rid, model, req, created))
    yield ev("response.in_progress", response=_response(None, rid, model, req, created))
    sent, text_open, msg_id = "", False, wire_id("msg_")
    name = "response.output_text.delta"
    delta = {"item_id": msg_id, "output_index": 0, "content_index": 0, "delta": SLOT, "logprobs": []}
    text = Frame({"type": name, "sequence_number": SLOT, **delta}, name)  # slots: number, text

    def text_delta(piece: str) -> str:
        nonlocal seq
        seq += 1
        return text.fill(seq - 1, piece)

    async for item in items:
        if isinstance(item, StreamedText):
            async for piece in item:
                if not text_open:
                    text_open = True
                    empty = {
                        "type": "message",
                        "id": msg_id,
                        "status": "in_progress",
                        "role": "assistant",
                        "content": [],
                    }
                    yield ev("response.output_item.added", output_index=0, item=empty)
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield ev(
                        "response.content_part.added",
                        item_id=msg_id,
                        output_index=0,
                        content_index=0,
                        part=part,
                    )
                sent += piece
                yield text_delta(piece)
            continue
        r = item
        final = _response(r, rid, model, req, created, tok)
        outputs = final["output"]
        for o in outputs:
            if o["type"] == "message":
                o["id"] = msg_id
        start = 0
        if text_open:
            msg = next(o for o in outputs if o["type"] == "message")
            start = 1
            rest = r.message.content[len(sent) :] if r.message.content.startswith(sent) else ""
            if rest:
                yield text_delta(rest)
            outputs.remove(msg)
            outputs.insert(0, msg)
            yield from_text_done(ev, msg, 0)
        for i, o in enumerate(outputs[start:], start):
            for frame in _item_frames(ev, o, i):
                yield frame
        final["output"] = outputs
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield ev(kind, response=final)


def from_text_done(ev: Any, msg: dict[str, Any], index: int) -> str:
    part = msg["content"][0]
    return "".join(
        [
            ev(
                "response.output_text.done",
                item_id=msg["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            ),
            ev(
                "response.content_part.done",
                item_id=msg["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            ev("response.output_item.done", output_index=index, item=msg),
        ]
    )


def _item_frames(ev: Any, item: dict[str, Any], index: int) -> list[str]:
    if item["type"] == "message":
        empty = {**item, "status": "in_progress", "content": []}
        part = item["content"][0]
        return [
            ev("response.output_item.added", output_index=index, item=empty),
            ev(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part={**part, "text": "", "logprobs": []},
            ),
            ev(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=part["text"],
                logprobs=[],
            ),
            from_text_done(ev, item, index),
        ]
    if item["type"] == "function_call":
        return [
            ev(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            ev(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            ),
            ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            ),
            ev("response.output_item.done", output_index=index, item=item),
        ]
    return [
        ev("response.output_item.added", output_index=index, item=item),
        ev("response.output_item.done", output_index=index, item=item),
    ]


@router.post("/responses", response_model=None)
async def responses(body: ResponsesBody, request: Request, program: Program = Depends(caller)) -> Response:
    """OpenAI Responses; streamed when ``stream`` is true."""
    gw = gateway(request)
    previous = gw.previous_messages(program, body.previous_response_id) if body.previous_response_id else []
    req = to_request(body, previous)
    tok = gw.renderer.tok if LOGPROBS in (body.include or []) else None
    if not req.stream:
        r = await gw.chat(program, req)
        answer = _response(r, r.request_id, req.model or gw.model_name, req, r.created, tok)
        return FastJSONResponse(answer, headers=r.timing_headers())
    req.response_id = wire_id("resp_")
    items = await primed(gw.chat_stream(program, req))
    frames = _frames(items, req, req.model or gw.model_name, tok)
    return sse_response(request.url.path, frames, False, items)
