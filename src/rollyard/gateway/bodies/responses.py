"""OpenAI Responses request body: input items and content parts by ``type``, tools by ``type``."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field, Tag

from rollyard.gateway.bodies.common import (
    Body,
    Bool,
    FormatHolder,
    MaxTokens,
    Name,
    Part,
    StrictInt,
    Temperature,
    TopP,
    tag,
)

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ResponsesTextPart(Part):
    type: Literal["input_text", "output_text", "text", "summary_text", "reasoning_text"]
    text: str


class InputImage(Part):
    """In the schema so the answer can say why it is refused (this model reads text)."""

    type: Literal["input_image"]


class InputFile(Part):
    type: Literal["input_file"]


class RefusalPart(Part):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[ResponsesTextPart | InputImage | InputFile | RefusalPart, Field(discriminator="type")]


class MessageItem(Part):
    type: NotRequired[Literal["message"]]
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(Part):
    type: Literal["function_call"]
    call_id: NotRequired[str]
    name: Name
    arguments: NotRequired[str | dict[str, Any] | None]


class FunctionCallOutputItem(Part):
    type: Literal["function_call_output"]
    call_id: NotRequired[str]
    output: str | list[ContentPart]


class ReasoningItem(Part):
    type: Literal["reasoning"]
    summary: NotRequired[list[ContentPart]]
    content: NotRequired[list[ContentPart] | None]
    encrypted_content: NotRequired[str | None]


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    tag("type", "message"),
]


class ResponsesFunctionTool(Part):
    type: Literal["function"]
    name: Name
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[Bool | None]


class HostedTool(Part):
    """``web_search``, ``file_search``, ``local_shell``...: cannot run here, so skipped (recorded)."""

    type: str


Tool = Annotated[
    Annotated[ResponsesFunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
    tag("type", known=("function",), other="hosted"),
]


class FunctionChoice(Part):
    type: Literal["function"]
    name: Name


IGNORED = (
    "reasoning",
    "store",
    "prompt_cache_key",
    "parallel_tool_calls",
    "text",
    "truncation",
    "metadata",
    "user",
    "service_tier",
)


class ResponsesBody(Body):
    model: str = ""
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: Bool | None = False
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None  # "message.output_text.logprobs" honoured, the rest recorded
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    store: Bool | None = None
    prompt_cache_key: str | None = None
    parallel_tool_calls: Bool | None = None
    text: FormatHolder | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
