"""Memory publication and the version fence against real vLLM.

The engine serves exactly what a disk reload would give, no file is written, and under
publishes every second no completion's tokens come from two versions: each completion's
logprobs are recomputed with the model of the version it was stamped with. An engine killed
during an update is held out, restarted and caught up; the other takes the new version."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollyard.core import SamplingParams
from rollyard.core.errors import EngineUnavailable, TrainError
from rollyard.engines import VLLMBackend
from rollyard.engines.launcher import VLLMServer
from rollyard.rollout.services import LOGPROBS_OF_SAMPLED, EngineFleet, publish_healing
from rollyard.train.publish import WeightPublisher
from rollyard.train.weight_stream import model_weights

pytestmark = pytest.mark.engine

PROMPTS = [[1, 482, 201, 400, 483, 2, 1, 378, 201], [1, 300, 301, 302, 2, 1, 378], [1, 99, 7, 640, 2]]


def perturbed(model_dir: Path, seed: int, scale: float = 0.02) -> torch.nn.Module:
    """The base model after a small, real change, as an optimizer step would make."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def trainer_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


async def greedy(engine: VLLMBackend) -> list[list[float]]:
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)
    return [(await engine.generate(p, params)).logprobs for p in PROMPTS]


async def trainer_diff(engine: VLLMBackend, model: torch.nn.Module) -> float:
    """How far the engine's greedy logprobs on a prompt are from the trainer model's own."""
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)
    done = await engine.generate(PROMPTS[0], params)
    ref = trainer_logprobs(model, PROMPTS[0], done.token_ids)
    return max(abs(a - b) for a, b in zip(done.logprobs, ref, strict=True))


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True))


def files_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


async def test_memory_publish_equals_a_disk_reload_and_writes_nothing(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = VLLMBackend(vllm_url)
    model = perturbed(tiny_model_dir, 5)
    root = tmp_path / "weights"
    root.mkdir()
    memory = WeightPublisher([engine], root, base_path=tiny_model_dir, mode="memory")
    try:
        base_digest = (await engine.rpc("rollyard_weights_digest"))[0]
        before = await greedy(engine)
        await memory.start()
        assert await memory.publish(model, 1) is None
        assert files_under(root) == []  # nothing written, not even a temporary dir
        assert engine.policy_version == 1 == await engine.engine_version()
        # the worker timed its own receive, load and re-pack (the split bench publish reports)
        assert all(memory.last[f"engine_{k}_s"] > 0 for k in ("receive", "load", "repack")), memory.last
        assert (await engine.rpc("rollyard_weights_digest"))[0] != base_digest
        by_memory = await greedy(engine)
        assert by_memory != before
        assert await trainer_diff(engine, model) < 1e-3  # the trainer's own distribution
        disk = WeightPublisher([engine], root, base_path=tiny_model_dir, base_version=1, mode="disk")
        await disk.publish(model, 2)
        assert engine.policy_version == 2 == await engine.engine_version()
        assert disk.last["save_s"] > 0 and disk.last["engine_repack_s"] > 0, disk.last
        by_disk = await greedy(engine)
        assert max_diff(by_memory, by_disk) <= 1e-5
        assert await trainer_diff(engine, model) < 1e-3  # and so is the disk reload's
        # a further memory publish after a disk one takes effect again
        model2 = perturbed(tiny_model_dir, 6)
        await memory.publish(model2, 3)
        assert engine.policy_version == 3 == await engine.engine_version()
        assert await greedy(engine) != by_disk
        assert sorted(p.name for p in root.iterdir()) == ["v000002"]  # the disk publish's only
    finally:
        await engine.load_weights(str(tiny_model_dir), version=0)
        await engine.aclose()


async def test_weights_missing_a_parameter_hold_the_engine_out(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A weight source that leaves a parameter out would serve two versions' values at once: the
    worker refuses it and the publisher holds the engine out."""
    engine = VLLMBackend(vllm_url)
    model = perturbed(tiny_model_dir, 7)

    def partial() -> list[tuple[str, torch.Tensor]]:
        return [(n, t) for n, t in model_weights(model) if "layers.0.mlp" not in n]

    memory = WeightPublisher([engine], tmp_path, base_path=tiny_model_dir, mode="memory", weights=partial)
    try:
        await memory.start()
        with pytest.raises(TrainError, match="failed to take weights version 1"):
            await memory.publish(model, 1)
        assert engine.held is not None and "unloaded" in engine.held
    finally:
        engine.release()
        await engine.load_weights(str(tiny_model_dir), version=0)
        await engine.aclose()


async def test_no_completion_mixes_versions_under_publishes(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Completions run back to back from 8 clients while two clearly different models are
    published in turn every second; every completion's logprobs must be those of the model of
    the version it was stamped with (the other model's differ by far more: checked too)."""
    engine = VLLMBackend(vllm_url)
    models = {0: perturbed(tiny_model_dir, 11, 0.1), 1: perturbed(tiny_model_dir, 12, 0.1)}
    publisher = WeightPublisher([engine], tmp_path / "w", base_path=tiny_model_dir, mode="memory")
    stamped: list[tuple[int, list[int], list[int], list[float]]] = []
    rng = random.Random(3)
    try:
        await publisher.start()
        await publisher.publish(models[1], 1)
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                prompt = [1] + [rng.randrange(3, 900) for _ in range(rng.randrange(4, 30))]
                params = SamplingParams(max_tokens=rng.randrange(8, 48), temperature=1.0, logprobs=True)
                c = await engine.generate(prompt, params)
                stamped.append((c.policy_version, prompt, c.token_ids, c.logprobs))

        clients = [asyncio.create_task(client()) for _ in range(8)]
        for version in range(2, 8):
            await asyncio.sleep(1.0)
            await publisher.publish(models[version % 2], version)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*clients)
    finally:
        await engine.load_weights(str(tiny_model_dir), version=0)
        await engine.aclose()
    versions = {v for v, *_ in stamped}
    assert len(versions) >= 5, versions  # the completions did straddle the publishes
    mixed, discriminated = 0, 0
    for version, prompt, ids, lps in stamped:
        own = trainer_logprobs(models[version % 2], prompt, ids)
        other = trainer_logprobs(models[(version + 1) % 2], prompt, ids)
        mixed += max(abs(a - b) for a, b in zip(lps, own, strict=True)) > 1e-3
        discriminated += max(abs(a - b) for a, b in zip(lps, other, strict=True)) > 1e-2
    assert mixed == 0, f"{mixed} of {len(stamped)} completions mixed versions"
    assert discriminated == len(stamped)  # a mixed completion could not have passed unseen


GREEDY = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)


@pytest.mark.slow
async def test_an_engine_killed_mid_update_is_held_out_then_restarted_on_the_live_weights(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A second engine beside the session's; it is killed while its update is under way."""
    server = VLLMServer(
        tiny_model_dir,
        kv_tokens=4096,
        max_model_len=1024,
        served_name="tiny",
        log_path=tmp_path / "engine1.log",
        extra_args=list(LOGPROBS_OF_SAMPLED),
    )
    await asyncio.to_thread(server.start)
    survivor = VLLMBackend(vllm_url, name="engine0")
    victim = VLLMBackend(server.url, name="engine1")
    fleet = EngineFleet([server], [victim], tiny_model_dir, 0)  # only engine1 is ours to restart
    publisher = WeightPublisher([survivor, victim], tmp_path / "w", base_path=tiny_model_dir, mode="memory")
    fleet.catch_up = publisher.catch_up
    model = perturbed(tiny_model_dir, 21)
    try:
        await publisher.start()
        first_pid = server.proc.pid  # type: ignore[union-attr]
        publishing = asyncio.create_task(publisher.publish(model, 1))
        while victim._fence is None:  # the victim's update has begun
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        server.kill()
        with pytest.raises(TrainError, match="engine1"):
            await publishing
        # the survivor took version 1; the victim is held out, not serving anything
        assert survivor.policy_version == 1 == await survivor.engine_version()
        assert victim.held is not None
        with pytest.raises(EngineUnavailable):
            await victim.generate(PROMPTS[0], GREEDY)
        with pytest.raises(EngineUnavailable):
            await victim.stats()  # what the gateway polls: it routes around the engine
        assert not await victim.health()
        # the step's publish path restarts it and gives it the live weights
        assert await publish_healing(publisher, fleet, model, 1) is None
        assert server.proc.pid != first_pid and fleet.restarts == 1  # type: ignore[union-attr]
        assert victim.held is None
        assert victim.policy_version == 1 == await victim.engine_version()
        want = [(await survivor.generate(p, GREEDY)).logprobs for p in PROMPTS]
        got = [(await victim.generate(p, GREEDY)).logprobs for p in PROMPTS]
        assert max_diff(want, got) <= 1e-5
    finally:
        fleet.stop()
        await survivor.load_weights(str(tiny_model_dir), version=0)
        await survivor.aclose()
        await victim.aclose()
