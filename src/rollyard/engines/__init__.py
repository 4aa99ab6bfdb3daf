"""Inference engines behind one narrow ``Backend`` protocol, and the local model/engine tooling."""

from rollyard.engines.base import Backend, Completion, CompletionDelta, EngineStats, WrappedBackend
from rollyard.engines.chat_template import (
    CHAT_TEMPLATE,
    ParsedAssistant,
    ToolCall,
    format_tool_call,
    parse_assistant,
    render_conversation,
    render_generation_prompt,
    render_message,
    tool_call_regex,
)
from rollyard.engines.launcher import VLLMServer, free_port
from rollyard.engines.vllm import VLLMBackend

__all__ = [
    "CHAT_TEMPLATE",
    "Backend",
    "Completion",
    "CompletionDelta",
    "EngineStats",
    "ParsedAssistant",
    "ToolCall",
    "VLLMBackend",
    "VLLMServer",
    "WrappedBackend",
    "format_tool_call",
    "free_port",
    "parse_assistant",
    "render_conversation",
    "render_generation_prompt",
    "render_message",
    "tool_call_regex",
]
