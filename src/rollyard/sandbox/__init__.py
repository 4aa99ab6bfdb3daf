"""Isolated, clean, cheap workspaces for model-written commands."""

from rollyard.sandbox.base import ExecResult, Limits, Sandbox, SandboxProvider, SandboxSpec

__all__ = ["ExecResult", "Limits", "Sandbox", "SandboxProvider", "SandboxSpec"]
