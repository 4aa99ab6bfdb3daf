"""Weight publishing against real vLLM: the engine serves exactly what the trainer holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollyard.core import SamplingParams, TrainError
from rollyard.engines import VLLMBackend
from rollyard.engines.launcher import free_port
from rollyard.train.publish import WeightPublisher

pytestmark = pytest.mark.engine

PROMPT = [1, 482, 201, 400, 483, 2, 1, 378, 201]


def _trainer_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def _perturbed(model_dir: Path) -> torch.nn.Module:
    """The base model after a small, real change, as one optimizer step would make."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return model


async def test_published_weights_give_the_trainers_logprobs(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = VLLMBackend(vllm_url)
    model = _perturbed(tiny_model_dir)
    publisher = WeightPublisher([engine], tmp_path / "weights", base_path=tiny_model_dir, keep=2)
    try:
        before = await engine.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0.0))
        for version in (1, 2, 3):
            await publisher.publish(model, version)
        after = await engine.generate(PROMPT, SamplingParams(max_tokens=24, temperature=1.0, seed=4))
        assert after.policy_version == 3 == engine.policy_version
        ref = _trainer_logprobs(model, PROMPT, after.token_ids)
        assert max(abs(a - b) for a, b in zip(after.logprobs, ref, strict=True)) < 1e-3
        greedy = await engine.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0.0))
        assert greedy.token_ids != before.token_ids
        kept = sorted(p.name for p in (tmp_path / "weights").iterdir())
        assert kept == ["v000002", "v000003"]  # old versions cleaned up
    finally:
        await engine.load_weights(str(tiny_model_dir), version=0)
        await engine.aclose()


async def test_nan_weights_are_never_published(vllm_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = VLLMBackend(vllm_url)
    model = _perturbed(tiny_model_dir)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    publisher = WeightPublisher([engine], tmp_path / "w", base_path=tiny_model_dir)
    try:
        with pytest.raises(TrainError, match="non-finite"):
            await publisher.publish(model, 1)
        assert engine.policy_version == 0
        assert publisher.version == 0
    finally:
        await engine.aclose()


async def test_a_refusing_engine_rolls_every_engine_back(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    live = VLLMBackend(vllm_url, name="live")
    dead = VLLMBackend(f"http://127.0.0.1:{free_port()}", name="dead")  # nothing listens there
    publisher = WeightPublisher(
        [live, dead], tmp_path / "w", base_path=tiny_model_dir, retries=2, retry_delay_s=0.05
    )
    try:
        greedy = SamplingParams(max_tokens=16, temperature=0.0)
        before = await live.generate(PROMPT, greedy)
        with pytest.raises(TrainError, match="dead"):
            await publisher.publish(_perturbed(tiny_model_dir), 1)
        assert live.policy_version == 0 and publisher.version == 0
        assert (await live.generate(PROMPT, greedy)).token_ids == before.token_ids
        assert not (tmp_path / "w" / "v000001").exists()
    finally:
        await live.load_weights(str(tiny_model_dir), version=0)
        await live.aclose()
        await dead.aclose()
