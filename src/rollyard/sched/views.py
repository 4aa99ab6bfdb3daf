"""What a scheduling policy may read: one view per program, per engine, per queued request.

Views are plain mutable records owned by the ``Scheduler``; the shell (the gateway's
``EnginePool``, or the simulator) feeds them from what it observes, policies only read them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollyard.core.program import ProgramPhase, ProgramState

__all__ = ["EngineView", "ProgramView", "Request", "SchedState"]

_HISTORY = 16  # output lengths kept per program


@dataclass
class ProgramView:
    """One program as the scheduler sees it.

    ``phase`` is derived by the scheduler, never set by the shell: a program is reasoning
    while it has a request queued, held or running, and acting otherwise, so a stream that
    ends without usage, an error, a disconnect or a cancel always returns it to acting.
    """

    id: str
    group_id: str | None = None
    group_size: int = 1
    phase: ProgramPhase = ProgramPhase.ACTING
    state: ProgramState = ProgramState.ACTIVE
    context_tokens: int = 0
    max_tokens: int | None = None  # its latest request's output cap (None: not given)
    engine: str | None = None  # sticky placement; None until first placed, or after its engine died
    waiting_since: float | None = None  # submit time of its queued or held request
    acting_since: float | None = None  # when its last request ended (for token decay)
    paused_at: float | None = None
    restored_at: float | None = None
    turns: int = 0
    output_lengths: deque[int] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    pauses: int = 0

    @property
    def paused(self) -> bool:
        return self.state is ProgramState.PAUSED


@dataclass
class EngineView:
    """One engine: static capacity plus what the shell last measured."""

    name: str
    capacity: int = 256  # concurrent requests the gateway sends it
    kv_capacity_tokens: int = 0  # from vLLM's cache_config_info; 0 = not known yet
    kv_usage: float = 0.0  # vLLM's kv_cache_usage_perc, 0..1
    healthy: bool = True
    in_flight: int = 0  # requests the gateway has started on it and not seen end
    waiting: int = 0  # requests queued inside the engine (vLLM's num_requests_waiting)
    prefill_tok_s: float = 0.0  # measured estimate; 0 = unknown
    decode_tok_s: float = 0.0
    service_s: float = 0.0  # mean seconds a request runs here (measured by the scheduler); 0 = unknown
    # "prefill": only prefills programs' long first prompts for decode engines (the gateway's
    # ``PrefillStage``); no policy places a program here (no free slot, not among healthy_engines)
    role: str = "both"

    @property
    def free(self) -> int:
        return self.capacity - self.in_flight if self.healthy and self.role != "prefill" else 0


@dataclass
class Request:
    """A model request waiting for the scheduler (one chunk of it, under divided rollout)."""

    request_id: str
    program_id: str
    prompt_tokens: int
    submitted_at: float
    max_tokens: int | None = None
    chunk: int = 0  # 0 for an undivided request or a divided one's first chunk


@dataclass
class SchedState:
    """Everything a policy may read; policies never mutate it."""

    engines: dict[str, EngineView] = field(default_factory=dict)
    programs: dict[str, ProgramView] = field(default_factory=dict)
    queue: deque[Request] = field(default_factory=deque)
    running: dict[str, tuple[Request, str]] = field(default_factory=dict)  # request id -> (request, engine)
    # group id -> the longest output any of its finished requests produced (kept after a program ends)
    group_longest: dict[str, int] = field(default_factory=dict)
    # While ``indexing`` (the Scheduler sets it for the span of one dispatch or tick), the first
    # ``KvBudget.used`` fills ``claims`` (engine -> (tokens, programs) claiming KV there; tokens are
    # contexts plus decode reserves for a buffer of ``claims_buffer``) in
    # one pass and later ones cost O(1); the Scheduler updates it as it places programs. Outside a
    # dispatch or tick, or for a policy driven without a Scheduler, every ``used`` scans.
    indexing: bool = False
    claims: dict[str, tuple[int, int]] | None = None
    claims_buffer: int = 0

    def programs_on(self, engine: str) -> list[ProgramView]:
        return [p for p in self.programs.values() if p.engine == engine and not p.state.is_over]

    def healthy_engines(self) -> list[EngineView]:
        """Engines a program may be placed on: healthy, and not prefill-only."""
        return [e for e in self.engines.values() if e.healthy and e.role != "prefill"]
