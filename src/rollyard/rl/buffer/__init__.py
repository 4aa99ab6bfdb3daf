"""Rollout buffer: pluggable release rules (windowed FIFO, strict FIFO, freshest-first,
staleness bound, whole groups) in a pure core, with asyncio and thread shells."""

from rollyard.rl.buffer.config import BufferConfig, ReleaseRule, StaleAction
from rollyard.rl.buffer.core import Release, Released, WindowedFifo
from rollyard.rl.buffer.shell import AsyncBuffer

__all__ = [
    "AsyncBuffer",
    "BufferConfig",
    "Release",
    "ReleaseRule",
    "Released",
    "StaleAction",
    "WindowedFifo",
]
