"""The Backend protocol, run against both real implementations: vLLM (HTTP) and HF (in-process)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rollyard.core import ContextLengthExceeded, FinishReason, InvalidRequest, SamplingParams
from rollyard.engines import Backend, VLLMBackend, render_conversation
from rollyard.engines.hf import HFBackend

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(params=["vllm", "hf"])
async def backend(request: pytest.FixtureRequest, tiny_model_dir: Path) -> AsyncIterator[Backend]:
    if request.param == "vllm":
        b: Backend = VLLMBackend(request.getfixturevalue("vllm_url"), name="vllm")
    else:
        b = HFBackend(tiny_model_dir, name="hf")
    yield b
    await b.aclose()


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir: Path) -> list[int]:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = render_conversation([{"role": "user", "content": "Find the value of key7 in data."}])
    return tok.encode(text, add_special_tokens=False)


async def test_generate_returns_one_logprob_per_token(backend: Backend, prompt_ids: list[int]) -> None:
    c = await backend.generate(prompt_ids, SamplingParams(max_tokens=10, temperature=1.0, seed=3))
    assert 1 <= len(c.token_ids) <= 10
    assert len(c.logprobs) == len(c.token_ids)
    assert all(lp <= 0.0 for lp in c.logprobs)
    assert c.prompt_tokens == len(prompt_ids)
    assert c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


async def test_greedy_generation_is_deterministic(backend: Backend, prompt_ids: list[int]) -> None:
    a = await backend.generate(prompt_ids, GREEDY)
    b = await backend.generate(prompt_ids, GREEDY)
    assert a.token_ids == b.token_ids


async def test_stream_concatenates_to_the_same_completion(backend: Backend, prompt_ids: list[int]) -> None:
    whole = await backend.generate(prompt_ids, GREEDY)
    ids: list[int] = []
    lps: list[float] = []
    reasons = []
    async for d in backend.stream(prompt_ids, GREEDY):
        ids += d.token_ids
        lps += d.logprobs
        reasons.append(d.finish_reason)
    assert ids == whole.token_ids
    assert lps == pytest.approx(whole.logprobs, abs=1e-4)
    assert reasons[-1] == whole.finish_reason
    assert all(r is None for r in reasons[:-1])


async def test_prompt_longer_than_context_is_a_typed_error(backend: Backend) -> None:
    with pytest.raises(ContextLengthExceeded):
        await backend.generate([5] * (backend.max_model_len or 2048) * 2, GREEDY)


async def test_empty_prompt_is_rejected(backend: Backend) -> None:
    with pytest.raises(InvalidRequest):
        await backend.generate([], GREEDY)


async def test_health_and_stats(backend: Backend) -> None:
    assert await backend.health()
    stats = await backend.stats()
    assert stats.kv_capacity_tokens > 0
    assert 0.0 <= stats.kv_usage <= 1.0


async def test_load_weights_changes_greedy_output_and_version(
    backend: Backend, prompt_ids: list[int], tiny_model_dir: Path, tiny_model_dir_seed1: Path
) -> None:
    before = await backend.generate(prompt_ids, GREEDY)
    v0 = backend.policy_version
    try:
        await backend.load_weights(str(tiny_model_dir_seed1), version=v0 + 1)
        after = await backend.generate(prompt_ids, GREEDY)
        assert backend.policy_version == v0 + 1
        assert after.policy_version == v0 + 1
        assert after.token_ids != before.token_ids
    finally:  # the session's engine is shared: put the original weights back
        await backend.load_weights(str(tiny_model_dir), version=v0)
    restored = await backend.generate(prompt_ids, GREEDY)
    assert restored.token_ids == before.token_ids
