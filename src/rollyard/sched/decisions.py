"""What a policy decides; the shell (gateway or simulator) carries it out."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Decision", "Move", "Pause", "Restore", "Start"]


@dataclass(frozen=True)
class Start:
    """Send this request to ``engine`` now."""

    request_id: str
    program_id: str
    engine: str
    moved_from: str | None = None  # the engine this program left (dead, or a costlier queue)
    waited_s: float = 0.0
    priority: int | None = None  # vLLM per-request priority (lower runs first); None: engine default


@dataclass(frozen=True)
class Pause:
    """Hold the program's requests in the gateway until it is restored (KV is not touched)."""

    program_id: str
    engine: str | None
    reason: str = "kv_pressure"


@dataclass(frozen=True)
class Restore:
    """Let a paused program run again, on ``engine`` (any engine, not only the one it left)."""

    program_id: str
    engine: str
    held_s: float = 0.0
    pooled: bool = False  # off its engine, charged a load from the shared KV pool, not a re-prefill


@dataclass(frozen=True)
class Move:
    """Re-home a program: its next request runs on ``dst`` and pays a re-prefill there (or, with
    ``pooled``, loads its context from the shared KV pool)."""

    program_id: str
    src: str | None
    dst: str
    reason: str = ""
    pooled: bool = False


Decision = Start | Pause | Restore | Move
