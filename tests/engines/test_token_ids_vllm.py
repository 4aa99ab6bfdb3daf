"""The completion ids the gateway reads from vLLM's logprobs (``return_tokens_as_token_ids``,
``"token_id:N"``) are vLLM's own ``token_ids`` (``return_token_ids``), on a real engine: streamed
and not, cut by a stop string, ended by EOS, constrained by a grammar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from transformers import AutoTokenizer

from rollyard.core import SamplingParams
from rollyard.core.engine_key import engine_headers
from rollyard.engines import VLLMBackend, render_conversation
from rollyard.engines.vllm_choice import token_ids

pytestmark = pytest.mark.engine


def _parsed(choice: dict[str, Any]) -> list[int]:
    """What the gateway reads when the engine sends no ``token_ids``."""
    return token_ids({k: v for k, v in choice.items() if k != "token_ids"})


async def _both(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[list, list, int]:
    """vLLM's ids, the ids parsed from the logprobs' tokens, and its usage count, of one request."""
    body = {**body, "return_token_ids": True, "return_tokens_as_token_ids": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not body["stream"]:
            data = await resp.json()
            (choice,) = data["choices"]
            return choice["token_ids"], _parsed(choice), data["usage"]["completion_tokens"]
        own: list[int] = []
        parsed: list[int] = []
        counted = -1
        async for line in resp.content:
            payload = line.strip().removeprefix(b"data:").strip()
            if not payload or payload == b"[DONE]":
                continue
            event = json.loads(payload)
            for choice in event.get("choices") or []:
                own += choice.get("token_ids") or []
                parsed += _parsed(choice)
            if event.get("usage"):
                counted = event["usage"]["completion_tokens"]
        return own, parsed, counted


@pytest.mark.parametrize("stream", [False, True])
async def test_ids_read_from_the_logprobs_are_vllms_own(
    vllm_url: str, tiny_model_dir: Path, stream: bool
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.encode(
        render_conversation([{"role": "user", "content": "Count."}]), add_special_tokens=False
    )
    backend = VLLMBackend(vllm_url)
    try:
        # greedy: the same answer to every request (a seed is not sent to the CPU build)
        plain = SamplingParams(max_tokens=24, temperature=0.0, top_logprobs=2)
        grammar = SamplingParams(max_tokens=24, temperature=0.0, regex="[a-z]{3,8}( [a-z]{3,8}){0,3}")
        bodies = {
            name: await backend.completion_body(prompt, p, stream=stream)
            for name, p in (("plain", plain), ("grammar", grammar))
        }
        assert bodies["plain"]["return_tokens_as_token_ids"] and "return_token_ids" not in bodies["plain"]
        async with aiohttp.ClientSession(headers=engine_headers()) as session:
            own, parsed, counted = await _both(session, vllm_url, bodies["plain"])
            assert own and parsed == own and counted == len(own)
            # a stop string from inside that answer: the same request stops there, mid-text
            text = tok.decode(own[4:], skip_special_tokens=False)
            stop = text[:2] if text[:2].strip() else tok.decode(own[4:6])
            cut = await _both(session, vllm_url, {**bodies["plain"], "stop": [stop]})
            # EOS made the likeliest token: the answer ends with it (ignore_eos is off)
            eos = {**bodies["plain"], "max_tokens": 4, "logit_bias": {str(tok.eos_token_id): 100}}
            ended = await _both(session, vllm_url, eos)
            constrained = await _both(session, vllm_url, bodies["grammar"])
        for name, (own_ids, parsed_ids, n) in {"stop": cut, "eos": ended, "grammar": constrained}.items():
            assert own_ids and parsed_ids == own_ids and n == len(own_ids), name
        assert len(cut[0]) < len(own), (stop, cut[0], own)
        assert ended[0][-1] == tok.eos_token_id, ended[0]
        # the product's own path (its count check included) reads the same ids vLLM sends
        if stream:
            got = [t async for d in backend.stream(prompt, plain) for t in d.token_ids]
        else:
            got = (await backend.generate(prompt, plain)).token_ids
        assert got == own
    finally:
        await backend.aclose()
