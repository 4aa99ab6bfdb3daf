"""The grouped drafter inside a real vLLM, serving an RL group through the gateway (engine tests).

Drafting must not change what is sampled or recorded: at T=0 every recorded token is the target
model's own argmax (what decoding without drafting produces), and recorded logprobs equal a
transformers forward pass of the same ids.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
import uvicorn
from transformers import AutoModelForCausalLM

from rollyard.core.trajectory import Trajectory
from rollyard.engines import VLLMBackend, VLLMServer, free_port
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.metrics import acceptance
from rollyard.gateway import FastTokenizer, build_gateway, create_app

pytestmark = pytest.mark.engine
ADMIN = "drafting-admin"


@pytest.fixture(scope="module")
def drafting_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    log = tmp_path_factory.mktemp("vllm-draft") / "vllm.log"
    with VLLMServer(
        tiny_model_dir,
        kv_tokens=16384,
        max_model_len=2048,
        served_name="tiny",
        log_path=log,
        drafting=DraftingConfig(method="grouped_suffix", k=4),
        startup_timeout_s=600,  # the shared 2-core box is often loaded
    ) as server:
        yield server


@pytest.fixture(scope="module")
def gateway_url(
    drafting_engine: VLLMServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    db = tmp_path_factory.mktemp("gw") / "journal.db"
    backend = VLLMBackend(drafting_engine.url, name="vllm")
    gw = build_gateway({"vllm": backend}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(gw), port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    t.join(10)


def _stats(url: str) -> list:
    async def go() -> list:
        b = VLLMBackend(url)
        try:
            return [await b.stats()]
        finally:
            await b.aclose()

    return asyncio.run(go())


def _run_group(url: str, group: str, size: int, temperature: float) -> list[Trajectory]:
    """``size`` programs of one group answer the same question, concurrently, via the OpenAI SDK."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    progs = [
        httpx.post(
            f"{url}/programs",
            json={"group_id": group, "sampling": {"temperature": temperature, "max_tokens": 64}},
            headers=headers,
        ).json()
        for _ in range(size)
    ]

    def ask(p: dict) -> None:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key=p["api_key"], max_retries=0)
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count to ten"}])

    threads = [threading.Thread(target=ask, args=(p,)) for p in progs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [
        Trajectory.model_validate(
            httpx.get(f"{url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
        )
        for p in progs
    ]


def _forward(model_dir: Path, prompt: list[int], completion: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(completion)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_group_drafts_and_records_what_the_target_model_alone_would(
    gateway_url: str, drafting_engine: VLLMServer, tiny_model_dir: Path, temperature: float
) -> None:
    before = _stats(drafting_engine.url)
    trajs = _run_group(gateway_url, f"g-{temperature}", 4, temperature)
    drafted = acceptance(before, _stats(drafting_engine.url))
    assert all(t.num_turns == 1 for t in trajs)
    for traj in trajs:
        turn = traj.turns[0]
        logp = _forward(tiny_model_dir, turn.prompt_ids, turn.completion_ids)
        picked = logp[torch.arange(len(turn.completion_ids)), torch.tensor(turn.completion_ids)]
        assert (picked - torch.tensor(turn.completion_logprobs)).abs().max().item() <= 1e-3
        if temperature == 0.0:  # greedy: each token is the target's argmax, as without drafting
            assert logp.argmax(dim=-1).tolist() == turn.completion_ids
    if temperature == 0.0:
        assert len({tuple(t.turns[0].completion_ids) for t in trajs}) == 1
        assert drafted["spec_drafts"] > 0 and drafted["spec_accepted_tokens"] > 0
        assert drafted["spec_acceptance_len"] > 1.0
