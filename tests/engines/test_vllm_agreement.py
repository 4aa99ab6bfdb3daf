"""Engine/trainer agreement: vLLM's logprobs equal a transformers forward pass of the same ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollyard.core import SamplingParams
from rollyard.engines import VLLMBackend, render_conversation, tool_call_regex

pytestmark = pytest.mark.engine


def _rescore(
    model_dir: Path, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, dim=-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_vllm_logprobs_match_a_transformers_forward(
    vllm_url: str, tiny_model_dir: Path, temperature: float
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.encode(
        render_conversation([{"role": "user", "content": f"Say something at t={temperature}."}]),
        add_special_tokens=False,
    )
    backend = VLLMBackend(vllm_url)
    try:
        c = await backend.generate(prompt, SamplingParams(max_tokens=48, temperature=temperature, seed=11))
    finally:
        await backend.aclose()
    ref = _rescore(tiny_model_dir, prompt, c.token_ids, temperature)
    # The session's engine runs as a run starts it (--logprobs-mode processed_logprobs): the
    # logprobs are those of the distribution sampled from, the model's logits over the temperature.
    assert max(abs(a - b) for a, b in zip(c.logprobs, ref, strict=True)) < 1e-3


async def test_structured_output_makes_a_random_model_call_a_tool(
    vllm_url: str, tiny_model_dir: Path
) -> None:
    from rollyard.engines import parse_assistant

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.encode(
        render_conversation([{"role": "user", "content": "List files."}]), add_special_tokens=False
    )
    backend = VLLMBackend(vllm_url)
    try:
        c = await backend.generate(
            prompt, SamplingParams(max_tokens=64, temperature=1.0, seed=2, regex=tool_call_regex(["bash"]))
        )
    finally:
        await backend.aclose()
    parsed = parse_assistant(tok.decode(c.token_ids))
    assert not parsed.malformed
    assert [call.name for call in parsed.tool_calls] == ["bash"]
