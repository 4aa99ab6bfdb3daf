"""The event contract: ``Event.of`` builds from a validated payload without validating again, so
it must give exactly the event the validating constructor gives, for every payload kind."""

from __future__ import annotations

import pytest

from rollyard.core.events import (
    PAYLOADS,
    CompletionEvent,
    ContextRewriteEvent,
    Event,
    EventKind,
    PerturbationEvent,
    RequestErrorEvent,
    TestAccessEvent,
    ToolCallEvent,
    ToolResultEvent,
)

EXAMPLES = [
    ToolCallEvent(name="bash", arguments={"cmd": "ls", "n": [1, 2]}, call_id="call_1"),
    ToolCallEvent(name="bash", arguments="{not json"),
    ToolResultEvent(name="bash", call_id="c", is_error=True, exit_code=2, duration_s=0.5),
    ContextRewriteEvent(reason="tools_changed", segment=3, api="openai_chat"),
    CompletionEvent(text="hello", reasoning="because"),
    CompletionEvent(),
    TestAccessEvent(path="tests/test_x.py", how="read"),
    PerturbationEvent(name="flaky_net", detail={"p": 0.1}),
    RequestErrorEvent(status=400, code="context_length_exceeded", message="too long", body_bytes=10),
]


def test_the_examples_cover_every_payload_kind() -> None:
    assert {type(p) for p in EXAMPLES} == set(PAYLOADS.values())


@pytest.mark.parametrize("payload", EXAMPLES, ids=lambda p: type(p).__name__)
def test_event_of_equals_the_validated_event(payload: object) -> None:
    fast = Event.of(payload, turn_index=2, at=1.5)  # type: ignore[arg-type]
    kind = next(k for k, m in PAYLOADS.items() if isinstance(payload, m))
    checked = Event(kind=kind, turn_index=2, at=1.5, data=payload.model_dump())  # type: ignore[attr-defined]
    assert fast == checked and fast.model_dump_json() == checked.model_dump_json()
    assert Event.model_validate_json(fast.model_dump_json()) == fast
    assert fast.payload == payload


def test_the_constructor_still_holds_a_typed_kinds_data_to_its_contract() -> None:
    with pytest.raises(ValueError, match="tool_call event data breaks its contract"):
        Event(kind=EventKind.TOOL_CALL, data={"arguments": {}})
