"""Divided rollout (Seer, arXiv 2511.14617): one long generation as a sequence of short chunks.

Each chunk is a token-id continuation: the prompt ids plus every id generated so far, with
``max_tokens = min(chunk_tokens, remaining)``. Between chunks the request goes back to the
scheduler, which may continue it on the same engine (the prefix cache makes that nearly free)
or move it to an idle one (paying the re-prefill, which the router weighs). So a long request no
longer pins one engine for its whole life, and the engines' load evens out at every chunk.

The client sees one completion: text streams on across chunk boundaries, and usage, finish
reason and logprobs are those of the whole generation; the journal records one turn. At
temperature 0 the result equals the undivided generation token for token. A chunk that ends on
EOS or a stop token (finish ``stop``), or short of its budget, ends the whole generation.
Constrained generations (``regex``) are never divided: the constraint's state would restart.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion
from rollyard.sched import Start

__all__ = ["Divided", "Generated", "continues", "run_divided"]


@dataclass(frozen=True)
class Divided:
    """The gateway's divided-rollout setting: generations longer than ``chunk_tokens`` are chunked."""

    chunk_tokens: int

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ConfigError(f"divided rollout: chunk_tokens must be >= 1, not {self.chunk_tokens}")

    def applies(self, params: SamplingParams) -> bool:
        # constrained and top-logprob requests run in one piece (a grammar's state and the
        # alternatives would not carry across chunks)
        return params.max_tokens > self.chunk_tokens and not params.constrained and not params.top_logprobs


@dataclass
class Generated:
    """One generation as the recorder needs it, whether it ran in one piece or in chunks."""

    completion: Completion
    dispatch: Start  # the first (or only) chunk's start: its engine is the turn's engine
    started: float
    engine_s: float
    notes: dict[str, Any] = field(default_factory=dict)


def continues(completion: Completion | None, asked: int, left_after: int) -> bool:
    """Whether a chunk that was asked for ``asked`` tokens is followed by another one."""
    return (
        completion is not None
        and left_after > 0
        and completion.finish_reason is FinishReason.LENGTH
        and len(completion.token_ids) >= asked
    )


# one engine call: (prompt ids, params, chunk index, tokens generated before, tokens left after)
EngineCall = Callable[[list[int], SamplingParams, int, int, int], AsyncIterator[Any]]


async def run_divided(
    call: EngineCall, prompt_ids: list[int], params: SamplingParams, chunk_tokens: int
) -> AsyncIterator[Any]:
    """Drive ``call`` chunk by chunk; yields its text deltas, then one merged ``Generated``."""
    ids: list[int] = []
    lps: list[float] = []
    parts: list[Generated] = []
    while True:
        left = params.max_tokens - len(ids)
        size = min(chunk_tokens, left)
        part: Generated | None = None
        chunk_params = params.model_copy(update={"max_tokens": size})
        async with aclosing(call(prompt_ids + ids, chunk_params, len(parts), len(ids), left - size)) as items:
            async for item in items:
                if isinstance(item, Generated):
                    part = item
                else:
                    yield item
        assert part is not None
        parts.append(part)
        ids += part.completion.token_ids
        lps += part.completion.logprobs
        if not continues(part.completion, size, left - size):
            break
    yield merge(parts, ids, lps, len(prompt_ids))


def merge(parts: list[Generated], ids: list[int], lps: list[float], prompt_tokens: int) -> Generated:
    """The chunks as one generation: contiguous ids and logprobs, the last chunk's finish."""
    first, last = parts[0], parts[-1]
    engines = [p.dispatch.engine for p in parts]
    versions = {p.completion.policy_version for p in parts}
    completion = Completion(
        token_ids=ids,
        logprobs=lps,
        finish_reason=last.completion.finish_reason,
        prompt_tokens=prompt_tokens,
        policy_version=min(versions),
        engine=first.completion.engine,
        cached_prompt_tokens=first.completion.cached_prompt_tokens,
    )
    migrations = sum(1 for a, b in itertools.pairwise(engines) if a != b)
    notes = {
        "divided": {
            "chunks": len(parts),
            "engines": engines,
            "migrations": migrations,
            "chunk_tokens": [len(p.completion.token_ids) for p in parts],
        }
    }
    if len(versions) > 1:
        notes["divided"]["policy_versions"] = sorted(versions)
    return Generated(completion, first.dispatch, first.started, sum(p.engine_s for p in parts), notes)
