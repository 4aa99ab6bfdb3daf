"""The gateway bench's canned engine speaks vLLM's completion shape, as the gateway reads it."""

from __future__ import annotations

import httpx
from tests.gateway.conftest import serving

from rollyard.bench._canned_engine import make_app
from rollyard.core.sampling import SamplingParams
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
