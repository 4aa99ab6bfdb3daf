"""The gateway: OpenAI- and Anthropic-compatible, program-aware, token-exact proxy to the engines."""

from rollyard.gateway.app import build_gateway, create_app
from rollyard.gateway.programs import ProgramTable, resolve_admin_token
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import ConversationState, Renderer, RenderPlan
from rollyard.gateway.service import Gateway
from rollyard.gateway.settings import GatewayLimits
from rollyard.gateway.tokenizer import FastTokenizer, Tokenizer
from rollyard.gateway.types import ChatRequest, ChatResult, Message, Tool, ToolCall

__all__ = [
    "ChatRequest",
    "ChatResult",
    "ConversationState",
    "FastTokenizer",
    "Gateway",
    "GatewayLimits",
    "Message",
    "ProgramTable",
    "RenderPlan",
    "Renderer",
    "SqliteJournal",
    "Tokenizer",
    "Tool",
    "ToolCall",
    "build_gateway",
    "create_app",
    "resolve_admin_token",
]
