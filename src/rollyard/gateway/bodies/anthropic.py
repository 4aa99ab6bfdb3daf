"""Anthropic Messages request body: content blocks, tools and ``tool_choice`` by ``type``."""

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
    Temperature,
    TopK,
    TopP,
    tag,
)


class TextBlock(Part):
    type: Literal["text"]
    text: str


class ImageBlock(Part):
    """In the schema so the answer can say why it is refused (this model reads text)."""

    type: Literal["image"]
    source: dict[str, Any]


class DocumentBlock(Part):
    type: Literal["document"]
    source: dict[str, Any]


class ToolUseBlock(Part):
    type: Literal["tool_use"]
    id: NotRequired[str]
    name: Name
    input: NotRequired[dict[str, Any] | str | None]


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(Part):
    type: Literal["tool_result"]
    tool_use_id: NotRequired[str]
    content: NotRequired[str | list[ResultPart] | None]
    is_error: NotRequired[Bool | None]


class ThinkingBlock(Part):
    type: Literal["thinking"]
    thinking: str
    signature: NotRequired[str | None]


class RedactedThinkingBlock(Part):
    type: Literal["redacted_thinking"]
    data: NotRequired[str]


Block = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(Part):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class AnthropicCustomTool(Part):
    type: NotRequired[Literal["custom"]]
    name: Name
    description: NotRequired[str | None]
    input_schema: NotRequired[dict[str, Any] | None]


class ServerTool(Part):
    """A hosted tool (``web_search_...``, ``bash_...``): it cannot run here, so it is skipped."""

    type: str
    name: NotRequired[str]


Tool = Annotated[
    Annotated[AnthropicCustomTool, Tag("custom")] | Annotated[ServerTool, Tag("server")],
    tag("type", "custom", known=("custom",), other="server"),
]


class AutoChoice(Part):
    type: Literal["auto"]
    disable_parallel_tool_use: NotRequired[Bool | None]


class AnyChoice(Part):
    type: Literal["any"]
    disable_parallel_tool_use: NotRequired[Bool | None]


class ToolChoiceNamed(Part):
    type: Literal["tool"]
    name: Name
    disable_parallel_tool_use: NotRequired[Bool | None]


class NoneChoice(Part):
    type: Literal["none"]


ToolChoice = Annotated[AutoChoice | AnyChoice | ToolChoiceNamed | NoneChoice, Field(discriminator="type")]

# Accepted and recorded as ignored.
IGNORED = (
    "thinking",
    "context_management",
    "output_config",
    "metadata",
    "stop_sequences",
    "service_tier",
    "container",
    "mcp_servers",
)


class MessagesBody(Body):
    model: str = ""
    max_tokens: MaxTokens | None = None
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stream: Bool | None = False
    thinking: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    output_config: FormatHolder | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    service_tier: str | None = None
    container: str | dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
