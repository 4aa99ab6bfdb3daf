"""OpenAI Chat Completions request body: messages by ``role``, content parts and tools by ``type``."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field

from rollyard.gateway.bodies.common import (
    Body,
    Bool,
    MaxTokens,
    Name,
    OutputFormat,
    Part,
    Penalty,
    Seed,
    StrictInt,
    Temperature,
    TopK,
    TopP,
)


class ChatTextPart(Part):
    type: Literal["text"]
    text: str


class ImageUrlPart(Part):
    """Accepted by the schema so the answer can say why it is refused (this model reads text)."""

    type: Literal["image_url"]
    image_url: dict[str, Any]


class InputAudioPart(Part):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class FilePart(Part):
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(Part):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[ChatTextPart | ImageUrlPart | InputAudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[ChatTextPart | RefusalPart, Field(discriminator="type")]


class FunctionCall(Part):
    name: Name
    arguments: NotRequired[str | dict[str, Any] | None]


class ToolCallParam(Part):
    id: NotRequired[str | None]
    type: NotRequired[Literal["function"]]
    function: FunctionCall


class SystemMessage(Part):
    role: Literal["system", "developer"]
    content: str | list[ChatTextPart]
    name: NotRequired[str | None]


class UserMessage(Part):
    role: Literal["user"]
    content: str | list[UserPart]
    name: NotRequired[str | None]


class AssistantMessage(Part):
    role: Literal["assistant"]
    content: NotRequired[str | list[AssistantPart] | None]
    tool_calls: NotRequired[list[ToolCallParam] | None]
    reasoning_content: NotRequired[str | None]
    reasoning: NotRequired[str | None]
    refusal: NotRequired[str | None]
    name: NotRequired[str | None]


class ToolMessage(Part):
    role: Literal["tool"]
    content: str | list[ChatTextPart]
    tool_call_id: NotRequired[str | None]


# Tagged unions on a field are resolved in pydantic-core; a callable tag (``common.tag``) costs a
# Python call per item (measured: 5x slower validation), so it is kept to unions that need a default.
ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDef(Part):
    name: Name
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[Bool | None]


class ChatFunctionTool(Part):
    type: NotRequired[Literal["function"]]
    function: FunctionDef


# One member, no union: a tag function would cost a Python call per tool (Claude Code sends 24).
ChatTool = ChatFunctionTool


class FunctionName(Part):
    name: Name


class NamedToolChoice(Part):
    type: NotRequired[Literal["function"]]
    function: FunctionName


class StreamOptions(Part):
    include_usage: NotRequired[Bool | None]


# Accepted and knowingly not honoured; recorded in the turn's IGNORED_PARAMS event when set.
IGNORED = (
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "user",
    "parallel_tool_calls",
    "response_format",
    "stop",
    "metadata",
    "store",
    "reasoning_effort",
    "service_tier",
    "prediction",
    "modalities",
    "audio",
)


class ChatCompletionBody(Body):
    model: str = ""
    messages: list[ChatMessage]
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    n: StrictInt | None = Field(default=None, ge=1, le=128)
    seed: Seed | None = None
    stream: Bool | None = False
    stream_options: StreamOptions | None = None
    # not honoured (recorded), but typed so a wrong shape is a 400 and the schema is honest
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    parallel_tool_calls: Bool | None = None
    response_format: OutputFormat | None = None
    stop: str | list[str] | None = None
    logprobs: Bool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    metadata: dict[str, str] | None = None
    store: Bool | None = None
    reasoning_effort: str | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
