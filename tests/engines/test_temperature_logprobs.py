"""At temperature != 1 the recorded logprobs are those of the distribution that was sampled
(the engine runs with ``--logprobs-mode processed_logprobs``, as a run starts it), and the
trainer, dividing logits by the same temperature, computes the same numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollyard.core import Sample
from rollyard.core.sampling import SamplingParams
from rollyard.engines.vllm import VLLMBackend
from rollyard.train.attention import choose_attention, set_attention
from rollyard.train.objective import LossConfig
from rollyard.train.packing import pack_samples
from rollyard.train.step import forward_backward

pytestmark = pytest.mark.engine

T = 0.7


async def test_recorded_logprobs_at_t07_are_the_trainers_at_t07(vllm_url: str, tiny_model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    backend = VLLMBackend(vllm_url, name="e")
    try:
        prompt = [5, 17, 33, 60, 101, 7]
        c = await backend.generate(
            prompt, SamplingParams(max_tokens=32, temperature=T, seed=3, logprobs=True)
        )
    finally:
        await backend.aclose()
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    set_attention(model, choose_attention(torch.device("cpu"), "auto"))
    ids = prompt + c.token_ids
    n = len(ids)
    sample = Sample(
        token_ids=ids,
        loss_mask=[0] * len(prompt) + [1] * len(c.token_ids),
        logprobs=[0.0] * len(prompt) + c.logprobs,
        advantages=[0.0] * n,
    )
    packed = pack_samples([sample], token_budget=4096)
    cfg = LossConfig(kind="ppo")
    impl = choose_attention(torch.device("cpu"), "auto")
    with torch.no_grad():
        scaled = forward_backward(
            model, [sample], packed, cfg, impl, backward=False, keep_logprobs=True, temperature=T
        )
        raw = forward_backward(model, [sample], packed, cfg, impl, backward=False, keep_logprobs=True)
    recorded = torch.tensor(c.logprobs)
    at_t = scaled.logprobs[0][len(prompt) :]
    at_1 = raw.logprobs[0][len(prompt) :]
    assert torch.allclose(recorded, at_t, atol=1e-4), float((recorded - at_t).abs().max())
    assert float((recorded - at_1).abs().max()) > 0.05  # the raw distribution is a different one
