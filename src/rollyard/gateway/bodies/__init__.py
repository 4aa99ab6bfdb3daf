"""Typed request bodies of the three APIs; they drive both validation and ``/openapi.json``."""

from rollyard.gateway.bodies.anthropic import MessagesBody
from rollyard.gateway.bodies.common import bounded_names, bounded_value, ignored_fields
from rollyard.gateway.bodies.openai_chat import ChatCompletionBody
from rollyard.gateway.bodies.responses import ResponsesBody

__all__ = [
    "ChatCompletionBody",
    "MessagesBody",
    "ResponsesBody",
    "bounded_names",
    "bounded_value",
    "ignored_fields",
]
