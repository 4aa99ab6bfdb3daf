"""The event contract: what happened around the turns, one typed payload per kind.

Writers (the gateway, the white-box agent, the sandbox layer) build a payload model and wrap it
with ``Event.of``; readers (reward terms, metrics, advantages) call ``event.payload`` and get the
same model back. ``Event.data`` stays a plain dict so the journal and Parquet store it as JSON,
but it is validated against the kind's model on construction, so a writer that drifts from the
contract fails where it writes, not silently in a reward term three steps later.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollyard.core.assemble import assemble


class EventKind(StrEnum):
    TOOL_CALL = "tool_call"  # the model called a tool (gateway, parsed from its completion)
    TOOL_RESULT = "tool_result"  # the tool ran (agent / sandbox): error flag, exit code, duration
    CONTEXT_REWRITE = "context_rewrite"  # history truncated / summarized / edited: new segment
    COMPLETION = "completion"  # the decoded text of a turn's completion (gateway)
    TEST_ACCESS = "test_access"  # the agent touched test paths (hygiene)
    PERTURBATION = "perturbation"  # the environment was deliberately broken or varied
    IGNORED_PARAMS = "ignored_params"  # client fields the gateway could not honour (free-form)
    REQUEST_ERROR = "request_error"  # the gateway refused or failed one of the program's calls
    NOTE = "note"  # anything else worth keeping (free-form)


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCallEvent(_Payload):
    """Name and arguments as the model wrote them (parsed object, or the raw string)."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    call_id: str = ""


class ToolResultEvent(_Payload):
    """How a tool call ended. ``is_error``: malformed call, non-zero exit, timeout or a failure
    of the sandbox operation; ``exit_code`` only for commands."""

    name: str
    call_id: str = ""
    is_error: bool = False
    malformed: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = Field(default=0.0, ge=0.0)


class ContextRewriteEvent(_Payload):
    """History no longer extends the previous turn. ``reason`` says who and why: the gateway's
    render mismatch reason, or ``policy:<name>`` when a context-management policy fired."""

    reason: str = ""
    segment: int | None = None
    api: str | None = None
    policy: str | None = None
    messages_before: int | None = None
    messages_after: int | None = None
    tokens_before: int | None = None


class CompletionEvent(_Payload):
    """A turn's decoded text, so text-reading terms (language mixing, judge) need no tokenizer."""

    text: str = ""
    reasoning: str | None = None


class TestAccessEvent(_Payload):
    """The agent read, listed or changed a guarded path (decoy tests, the test dir)."""

    __test__ = False  # not a pytest class

    path: str
    how: str  # read, listed, modified, deleted, created
    where: str = "workspace"


class PerturbationEvent(_Payload):
    """A deliberate change to the environment before the agent started."""

    name: str
    detail: dict[str, Any] = Field(default_factory=dict)


class RequestErrorEvent(_Payload):
    """A model call that produced no turn, so a trajectory whose calls all failed says why:
    the status and error code the client got, the message (cut short), the body's size."""

    status: int
    code: str
    message: str = ""
    path: str = ""
    body_bytes: int | None = None


PAYLOADS: dict[EventKind, type[_Payload]] = {
    EventKind.TOOL_CALL: ToolCallEvent,
    EventKind.TOOL_RESULT: ToolResultEvent,
    EventKind.CONTEXT_REWRITE: ContextRewriteEvent,
    EventKind.COMPLETION: CompletionEvent,
    EventKind.TEST_ACCESS: TestAccessEvent,
    EventKind.PERTURBATION: PerturbationEvent,
    EventKind.REQUEST_ERROR: RequestErrorEvent,
}
_KIND_OF = {model: kind for kind, model in PAYLOADS.items()}


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: EventKind
    turn_index: int | None = None  # the turn it follows, if any
    at: float = 0.0
    data: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _contract(self) -> Event:
        model = PAYLOADS.get(self.kind)
        if model is not None:
            try:
                self.data = model.model_validate(self.data).model_dump(mode="json", exclude_defaults=True)
            except ValidationError as e:
                raise ValueError(f"{self.kind.value} event data breaks its contract: {e}") from None
        return self

    @classmethod
    def of(cls, payload: _Payload, *, turn_index: int | None = None, at: float = 0.0) -> Event:
        """The event carrying ``payload`` (its kind follows from the payload's type).

        The payload model was validated when it was built, so its dump is the contract's form
        already: the event is assembled without validating it a second time (the gateway makes
        one or more of these on its event loop for every model call)."""
        data = payload.model_dump(mode="json", exclude_defaults=True)
        return assemble(
            cls, {"kind": _KIND_OF[type(payload)], "turn_index": turn_index, "at": at, "data": data}
        )

    @property
    def payload(self) -> Any:
        """The typed payload (a ``*Event`` model), or the raw dict for free-form kinds."""
        model = PAYLOADS.get(self.kind)
        return model.model_validate(self.data) if model is not None else self.data
