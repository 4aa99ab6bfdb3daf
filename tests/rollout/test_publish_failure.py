"""An engine killed during a memory publish is held out, restarted and caught up; the other
engine takes the new version; neither ever serves a half-updated model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollyard.core import SamplingParams
from rollyard.core.errors import EngineUnavailable, TrainError
from rollyard.engines import VLLMBackend
from rollyard.engines.launcher import VLLMServer
from rollyard.rollout.services import LOGPROBS_OF_SAMPLED, EngineFleet, publish_healing
from rollyard.train.publish import WeightPublisher

from ..conftest import ENGINE_MAX_MODEL_LEN
from ..train.test_publish_memory import PROMPTS, max_diff, perturbed

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)


async def test_an_engine_killed_mid_update_is_held_out_then_restarted_on_the_live_weights(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = VLLMServer(
        tiny_model_dir,
        kv_tokens=4096,
        max_model_len=ENGINE_MAX_MODEL_LEN,
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
