"""What one generated turn is recorded as: the turn, its events, the conversation state that
the next request extends, and the answer every dialect reports.

No side effects (the clock's readings and the previous state are passed in; only the wire ids
and the answer's ``created`` second are drawn here), so the gateway and the bench's
required-work floor (``rollyard.bench._required_floor``) build the same record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rollyard.core.events import CompletionEvent, ContextRewriteEvent, ToolCallEvent
from rollyard.core.ids import wire_id
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import Event, EventKind, Turn, TurnTimings
from rollyard.gateway.divided import Generated
from rollyard.gateway.renderer import ConversationState, Renderer, RenderPlan
from rollyard.gateway.types import ChatRequest, ChatResult


@dataclass
class TurnRecord:
    turn: Turn
    segment: int
    events: list[Event]
    state: ConversationState
    result: ChatResult
    rewrote: bool  # the request did not extend the previous turn: a new segment
    malformed: bool  # the completion's tool calls did not parse


def build_turn(
    renderer: Renderer,
    request: ChatRequest,
    plan: RenderPlan,
    params: SamplingParams,
    gen: Generated,
    prev: ConversationState | None,
    submitted: float,
    now: float,
    model_name: str,
) -> TurnRecord:
    """The record of ``gen``, the answer to ``request`` rendered as ``plan`` after ``prev``."""
    completion, dispatch = gen.completion, gen.dispatch
    prefix = "toolu_" if request.api == "anthropic" else "call_"
    message, malformed = renderer.decode_completion(completion.token_ids, prefix, wire_id)
    index = prev.turn_index + 1 if prev else 0
    segment = prev.segment if prev and plan.extends else (prev.segment + 1 if prev else 0)
    flags = ["malformed_tool_call"] if malformed else []
    if params.constrained:
        flags.append("constrained_decoding")
    if plan.closed_with_eos:
        flags.append("eos_appended_to_previous")
    turn = Turn.of_valid_parts(
        index=index,
        prompt_ids=plan.prompt_ids,
        completion_ids=completion.token_ids,
        completion_logprobs=completion.logprobs,
        policy_version=completion.policy_version,
        finish_reason=completion.finish_reason,
        timings=TurnTimings(submitted=submitted, started=gen.started, finished=now),
        engine=dispatch.engine,
        sampling=params.model_dump(mode="json"),
        requested_sampling=request.requested_sampling(),
        flags=flags,
        # the grammar spans the whole completion (tool_grammar: wrapper and arguments)
        forced=[(0, len(completion.token_ids))] if params.constrained and completion.token_ids else None,
    )
    events: list[Event] = []
    rewrote = prev is not None and not plan.extends
    if rewrote:
        rewrite = ContextRewriteEvent(segment=segment, reason=plan.rewrite_reason or "", api=request.api)
        events.append(Event.of(rewrite, turn_index=index, at=now))
    if request.ignored:
        events.append(
            Event(kind=EventKind.IGNORED_PARAMS, turn_index=index, at=now, data=dict(request.ignored))
        )
    if dispatch.moved_from:
        events.append(
            Event(kind=EventKind.NOTE, turn_index=index, at=now, data={"moved_from": dispatch.moved_from})
        )
    if gen.notes:
        events.append(Event(kind=EventKind.NOTE, turn_index=index, at=now, data=dict(gen.notes)))
    text = CompletionEvent(text=message.content, reasoning=message.reasoning)
    events.append(Event.of(text, turn_index=index, at=now))
    events += [
        Event.of(ToolCallEvent(name=c.name, arguments=c.arguments, call_id=c.id), turn_index=index, at=now)
        for c in message.tool_calls
    ]
    response_id = request.response_id or wire_id("resp_")
    state = ConversationState(
        messages=list(request.messages),
        tools_key=plan.tools_key,
        returned=message,
        prompt_ids=plan.prompt_ids,
        completion_ids=completion.token_ids,
        turn_index=index,
        segment=segment,
        response_id=response_id,
    )
    result = ChatResult(
        message=message,
        finish_reason=completion.finish_reason,
        prompt_tokens=len(plan.prompt_ids),
        completion_tokens=len(completion.token_ids),
        cached_tokens=completion.cached_prompt_tokens or 0,
        completion_ids=completion.token_ids,
        completion_logprobs=completion.logprobs,
        completion_top_logprobs=completion.top_logprobs,
        malformed_tool_call=malformed,
        request_id=response_id,
        created=int(time.time()),
        model=request.model or model_name,
    )
    return TurnRecord(turn, segment, events, state, result, rewrote, malformed)
