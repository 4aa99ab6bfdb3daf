"""The one narrow protocol every inference engine speaks: token ids in, token ids out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason

TopLogprobs = list[list[tuple[int, float]]]  # per position: (token id, logprob), most likely first


class Completion(BaseModel):
    """One generation's result; ``logprobs[i]`` is the sampled token's log-probability.

    ``top_logprobs``: the alternatives at each position, only when the request asked for them
    (``SamplingParams.top_logprobs``); they go back to the client and are never recorded."""

    model_config = ConfigDict(extra="forbid")

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    policy_version: int = 0
    engine: str = ""
    cached_prompt_tokens: int | None = None
    top_logprobs: TopLogprobs | None = None


@dataclass(slots=True)
class CompletionDelta:
    """A streamed piece: new token ids and logprobs since the previous delta.

    The last delta carries ``finish_reason``; concatenating all deltas' ids gives exactly
    the non-streamed ``Completion.token_ids``. A plain dataclass, not a model: it passes only
    between an engine's reader and the gateway, built from values read and typed already, one
    or more per streamed token (a pydantic model cost ~2 us each to build, unvalidated).
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    policy_version: int = 0
    top_logprobs: TopLogprobs | None = None


class EngineStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kv_capacity_tokens: int = 0
    kv_usage: float = 0.0  # fraction of the KV cache in use, 0..1
    running: int = 0
    waiting: int = 0
    preemptions: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    prefill_tokens: int = 0  # computed (not cached) prompt tokens, total
    prefill_s: float = 0.0  # seconds requests spent in prefill, total
    # speculative decoding, cumulative since the engine started (all zero without drafting)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = Field(default_factory=list)
    # prompt tokens by where their KV came from, cumulative (``prompt_token_sources``)
    prompt_tokens_by_source: dict[str, int] = Field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """An inference engine instance. All methods raise ``EngineUnavailable`` when it is down."""

    name: str
    max_model_len: int

    @property
    def policy_version(self) -> int:
        """Version of the weights now loaded; recorded on every turn."""
        ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]: ...

    async def stats(self) -> EngineStats: ...

    async def health(self) -> bool: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def abort(self, request_ids: list[str] | None = None) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def load_weights(self, path: str, version: int) -> None: ...

    async def aclose(self) -> None: ...


class WrappedBackend:
    """A backend that changes some calls of ``inner`` and passes everything else through.

    Subclasses override what they change; attributes they do not define are the engine's own.
    The protocol's two properties are spelled out so that type checkers see a ``Backend``."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.name = inner, inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version
