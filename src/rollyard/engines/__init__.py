"""Inference engines behind one narrow ``Backend`` protocol."""

from rollyard.engines.base import Backend, Completion, CompletionDelta, EngineStats

__all__ = ["Backend", "Completion", "CompletionDelta", "EngineStats"]
