"""OpenAI's per-token ``logprobs`` entries (Chat ``choice.logprobs.content``, Responses
``output_text.logprobs``), built from a result's ids: one shape, shared by both routes.

The sampled tokens' logprobs are the recorded ones; ``top_logprobs`` alternatives exist only
when the request asked for them (the engine is asked for nothing more otherwise).
"""

from __future__ import annotations

from typing import Any

from rollyard.gateway.tokenizer import Tokenizer
from rollyard.gateway.types import ChatResult


def _entry(tok: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tok.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def token_logprobs(r: ChatResult, tok: Tokenizer) -> list[dict[str, Any]]:
    top = r.completion_top_logprobs or []
    out = []
    for i, (token_id, lp) in enumerate(zip(r.completion_ids, r.completion_logprobs, strict=False)):
        alternatives = [_entry(tok, t, v) for t, v in top[i]] if i < len(top) else []
        out.append({**_entry(tok, token_id, lp), "top_logprobs": alternatives})
    return out
