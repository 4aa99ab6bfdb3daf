"""Agents: the white-box tool loop with context-management policies, and the black-box runner
that puts an unmodified CLI agent in a sandbox whose only reachable address is its endpoint."""

from rollyard.agents.context import ContextPolicy, PolicyKind, apply_policy, estimate_tokens
from rollyard.agents.loop import AgentConfig, AgentResult, ExitReason, WhiteBoxAgent
from rollyard.agents.tools import TOOL_NAMES, TOOLS, ToolOutcome, run_tool, truncate

__all__ = [
    "TOOLS",
    "TOOL_NAMES",
    "AgentConfig",
    "AgentResult",
    "ContextPolicy",
    "ExitReason",
    "PolicyKind",
    "ToolOutcome",
    "WhiteBoxAgent",
    "apply_policy",
    "estimate_tokens",
    "run_tool",
    "truncate",
]
