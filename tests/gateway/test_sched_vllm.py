"""Pause and restore on the real engine: multi-turn agents over the official SDK against a
gateway running the ``rollyard`` policy, their contexts adding up to more than the engine's
KV cache (its capacity comes from vLLM's own ``cache_config_info``): the session engine's
16k tokens hold PROGRAMS - 2 of them, so programs wait, are paused to make room for overdue
ones, and are restored."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from rollyard.core.trajectory import Trajectory, extends
from rollyard.engines.launcher import free_port
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.sched import make_policy

pytestmark = pytest.mark.engine
ADMIN = "sched-admin"
PROGRAMS, TURNS, MAX_TOKENS = 12, 3, 24
PROMPT_CAP = 1700  # first prompts stay this far under the engine's 2048-token context


def kv_capacity(url: str) -> int:
    async def go() -> int:
        b = VLLMBackend(url)
        try:
            return (await b.stats()).kv_capacity_tokens
        finally:
            await b.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def prompt_tokens(vllm_url: str) -> int:
    """First-prompt size at which PROGRAMS - 2 programs fill the engine's KV cache."""
    kv = kv_capacity(vllm_url)
    assert kv > 0, "vLLM did not report its KV capacity"
    size = kv // (PROGRAMS - 2)
    assert size <= PROMPT_CAP, f"the session engine's KV ({kv}) is too large for this test"
    return size


def first_prompt(tokenizer: FastTokenizer, n: int, size: int) -> str:
    """A first user message of about ``size`` tokens, different for every program."""
    words = f"program {n}:"
    while len(tokenizer.encode(words)) < size:
        words += " explore the repository"
    return words


@pytest.fixture(scope="module")
def gateway_url(
    vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    policy = make_policy("rollyard", tick_s=0.5, max_hold_s=3.0, min_run_s=1.0)
    db = tmp_path_factory.mktemp("gw") / "journal.db"
    gw = build_gateway(
        {"vllm": VLLMBackend(vllm_url, name="vllm")},
        FastTokenizer(tiny_model_dir),
        db,
        ADMIN,
        "tiny",
        policy=policy,
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(gw, poll_interval_s=0.5), port=port, log_level="warning")
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    t.join(10)


async def agent(url: str, n: int, prompt: str) -> str:
    """One program: TURNS model calls, each followed by a 'tool' that sleeps 0.3-1.2 s."""
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{url}/programs", json={"sampling": {"max_tokens": MAX_TOKENS}}, headers={"x-api-key": ADMIN}
        )
        assert r.status_code == 201, r.text
        p = r.json()
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=p["api_key"], max_retries=0, timeout=300)
    rng = random.Random(n)
    msgs: list[dict] = [{"role": "user", "content": prompt}]
    for k in range(TURNS):
        r = await api.chat.completions.create(model="tiny", messages=msgs)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        await asyncio.sleep(rng.uniform(0.3, 1.2))
        msgs.append({"role": "user", "content": f"tool output {k}: " + "file.py " * rng.randint(5, 15)})
    await api.close()
    return str(p["id"])


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_pauses_and_restores_happen_and_no_turn_is_lost_or_reordered(
    gateway_url: str, prompt_tokens: int, tiny_model_dir: Path
) -> None:
    tok = FastTokenizer(tiny_model_dir)
    prompts = [first_prompt(tok, n, prompt_tokens) for n in range(PROGRAMS)]

    async def run_all() -> list[str]:
        return await asyncio.gather(*(agent(gateway_url, n, prompts[n]) for n in range(PROGRAMS)))

    ids = asyncio.run(asyncio.wait_for(run_all(), 600))
    text = httpx.get(f"{gateway_url}/metrics", headers={"x-api-key": ADMIN}).text  # closed by default
    assert metric(text, "rollyard_sched_pauses_total") >= 1, text
    assert metric(text, "rollyard_sched_restores_total") >= 1
    assert metric(text, "rollyard_sched_hold_seconds_count") >= 1
    for pid in ids:
        traj = Trajectory.model_validate(
            httpx.get(f"{gateway_url}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN}).json()
        )
        assert traj.num_turns == TURNS  # none lost
        for seg in traj.segments:  # in order, token-exact: each prompt extends the last turn
            for a, b in itertools.pairwise(seg.turns):
                assert extends(a, b.prompt_ids)
