"""The gateway bench's canned engine speaks vLLM's completion shape, as the gateway reads it."""

from __future__ import annotations

import httpx
from tests.gateway.conftest import serving

from rollyard.core.sampling import SamplingParams
from rollyard.engines.canned import make_app
from rollyard.engines.vllm import VLLMBackend


async def test_the_gateway_backend_reads_its_answers_and_refuses_what_it_cannot_answer() -> None:
    with serving(make_app(max_model_len=512, token_interval_s=0.002)) as url:
        backend = VLLMBackend(url)
        try:
            one = await backend.generate([5, 6, 7], SamplingParams(max_tokens=12))
            again = await backend.generate([5, 6, 7], SamplingParams(max_tokens=12))
            deltas = [d async for d in backend.stream([5, 6, 7], SamplingParams(max_tokens=12))]
            assert backend.max_model_len == 512
        finally:
            await backend.aclose()
        assert len(one.token_ids) == len(one.logprobs) == 12 and one.finish_reason.value == "length"
        assert one.token_ids == again.token_ids and all(lp < 0 for lp in one.logprobs)
        # streamed, paced: the same ids and logprobs in several deltas, the finish reason on the last
        assert len(deltas) > 1 and [t for d in deltas for t in d.token_ids] == one.token_ids
        assert [lp for d in deltas for lp in d.logprobs] == one.logprobs
        assert [d.finish_reason for d in deltas][-2:] == [None, one.finish_reason]
        text = httpx.post(f"{url}/v1/completions", json={"prompt": "text, not ids"}, timeout=10)
        assert text.status_code == 400 and "token-id prompts" in text.json()["error"]["message"]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


async def test_the_gateway_asks_for_no_prompt_echo_and_reads_the_ids_from_the_tokens() -> None:
    """With logprobs (every turn the gateway records) the completion's ids come as its tokens
    (``return_tokens_as_token_ids``): no ``return_token_ids``, so the engine does not send the
    prompt's ids back; the canned engine answers either way as vLLM does, with the same ids."""
    with serving(make_app(max_model_len=512)) as url:
        backend = VLLMBackend(url)
        try:
            body = await backend.completion_body(list(range(5, 400)), SamplingParams(max_tokens=8))
            got = await backend.generate(list(range(5, 400)), SamplingParams(max_tokens=8))
        finally:
            await backend.aclose()
        assert "return_token_ids" not in body and body["return_tokens_as_token_ids"] is True
        raw = httpx.post(f"{url}/v1/completions", json=body, timeout=10).json()["choices"][0]
        assert "prompt_token_ids" not in raw and "token_ids" not in raw
        echoed = httpx.post(f"{url}/v1/completions", json={**body, "return_token_ids": True}, timeout=10)
        assert echoed.json()["choices"][0]["token_ids"] == got.token_ids
        assert echoed.json()["choices"][0]["prompt_token_ids"] == list(range(5, 400))
