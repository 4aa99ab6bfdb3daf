"""What the gateway posts to vLLM's ``/v1/completions``: the body for a turn's prompt ids and
sampling, and its JSON with the prompt's ids written from what a conversation remembers.

Pure (no engine, no I/O): ``VLLMBackend`` posts them, and the gateway bench replays the same
bodies to the bare relay (``VLLMBackend.completion_body``).
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from rollyard.core.prompt_ids import ids_json_parts
from rollyard.core.sampling import SamplingParams

__all__ = ["body_json", "completion_body"]


def completion_body(
    model: str,
    max_model_len: int,
    prompt_ids: list[int],
    params: SamplingParams,
    stream: bool = False,
    send_seed: bool = False,
) -> dict[str, Any]:
    """The exact JSON posted for ``prompt_ids`` (already checked to fit ``max_model_len``; 0:
    unknown): ``max_tokens`` bounded by what the context leaves; ``send_seed``: forward a seed."""
    max_tokens = params.max_tokens
    if max_model_len:
        max_tokens = max(1, min(max_tokens, max_model_len - len(prompt_ids)))
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": params.top_logprobs if params.logprobs else None,
        "skip_special_tokens": False,
        "stream": stream,
    }
    if params.seed is not None and send_seed:
        body["seed"] = params.seed
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.logprobs:
        # The completion's ids as its logprobs' tokens ("token_id:N"; alternatives keyed so
        # too, not by ambiguous text), not ``return_token_ids``, which also echoes the whole
        # prompt's ids: ~150 KB for a 30k-token conversation, written by the engine and read
        # by the gateway every turn, in proportion to the history.
        body["return_tokens_as_token_ids"] = True
    else:
        body["return_token_ids"] = True
    if params.grammar:
        body["structured_outputs"] = {"grammar": params.grammar}
    elif params.regex:
        body["structured_outputs"] = {"regex": params.regex}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def body_json(body: dict[str, Any]) -> bytes:
    """A completion body as JSON, its prompt ids written by ``ids_json_parts``: of a
    conversation's next turn only the ids added since its last one (the rest of the text is
    remembered). One join for the whole body: the ids' text is not first joined on its own."""
    rest = memoryview(pydantic_core.to_json({k: v for k, v in body.items() if k != "prompt"}))
    comma = b"," if len(rest) > 2 else b""
    return b"".join((b'{"prompt":', *ids_json_parts(body["prompt"]), comma, rest[1:]))
