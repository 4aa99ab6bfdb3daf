"""``GatewayLimits``: the gateway's protective knobs, shared by ``rollyard gateway`` flags and
the ``gateway.limits`` section of a ``rollyard train`` config."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # a 200k-token agent conversation is ~1-2 MB of JSON


class GatewayLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    # /metrics is closed (admin token) unless opened: vLLM users expect it open behind their
    # own network policy, but program keys must not read other programs' numbers by default.
    open_metrics: bool = False
    # A program whose requests failed error_budget times within error_window_s is refused
    # (429) for error_cooldown_s; 0 turns the budget off.
    error_budget: int = Field(default=20, ge=0)
    error_window_s: float = Field(default=60.0, gt=0)
    error_cooldown_s: float = Field(default=30.0, gt=0)
    # An engine whose connection fails is held out for breaker_base_s, doubling per further
    # failure up to breaker_max_s, until a call succeeds.
    breaker_base_s: float = Field(default=1.0, gt=0)
    breaker_max_s: float = Field(default=30.0, gt=0)
    # Requests with more text than this are rendered (tokenized) in a worker thread, so the
    # event loop (and /health) never waits on a multi-megabyte prompt; each message counts as
    # RENDER_CHARS_PER_MESSAGE characters more, so many short messages are offloaded too.
    offload_chars: int = Field(default=32_768, ge=0)
    # A model request's body may hold this many JSON objects and arrays (messages, content parts,
    # tool schemas; brackets inside strings count too, a conservative bound), else 400 before it
    # is parsed: parsing and validating are on the event loop and cost ~2 us an object (a body of
    # 240,000 empty messages held every program for seconds). A 2,000-message agent conversation
    # with tools has ~10,000.
    max_body_objects: int = Field(default=50_000, ge=1)
    # Idle keep-alive connections are kept longer than clients keep theirs (httpx, aiohttp:
    # 5 s), so the client always closes first and never reuses one the server is closing.
    keep_alive_s: int = Field(default=65, ge=1)
    # Slow clients (gateway/conn_guard.py): a request's headers must arrive within
    # header_timeout_s of its first byte (or of the connection), its body within body_timeout_s of
    # its headers, else the connection is closed; headers over max_header_bytes get a 431; one
    # address holds at most max_conns_per_peer TCP connections (more are closed at once).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_conns_per_peer: int = Field(default=1024, ge=1)
    # An engine call that sends nothing for this long fails (EngineUnavailable, retryable; a
    # stream between 1 and 1.25 times this after its last byte: engines.stall_watch).
    engine_timeout_s: float = Field(default=600.0, gt=0)
    # A program that makes no model request for this long is terminated (status idle_timeout)
    # and its in-memory state freed, for clients that never call finish; 0: never.
    program_idle_ttl_s: float = Field(default=3600.0, ge=0)
