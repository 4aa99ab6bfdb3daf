"""Prefill/decode roles on real engines: a tiny-model prefill engine (kv_producer) and a decode
engine (kv_both) share ``engine.kv_pool: {kind: local}``. A program's long first prompt is
computed on the prefill engine, and the decode engine loads its full blocks from the pool (the
engines' own prompt-token counters); at T=0 the answer equals the colocated one."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.gateway.test_kv_pool_sched_vllm import serve

from rollyard.core.engine_key import engine_headers
from rollyard.core.trajectory import Trajectory
from rollyard.engines.kvpool import KVPoolConfig
from rollyard.engines.launcher import VLLMServer, start_together
from rollyard.engines.metrics import prompt_token_sources
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]
ADMIN = "pd-admin"
BLOCK = 64


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("pd")
    pool = KVPoolConfig(kind="local", root=str(tmp / "pool"))
    common = dict(kv_tokens=4096, max_model_len=1024, served_name="tiny", kv_pool=pool, startup_timeout_s=900)
    servers = [
        VLLMServer(tiny_model_dir, log_path=tmp / f"{role}.log", role=role, **common)  # type: ignore[arg-type]
        for role in ("prefill", "decode")
    ]
    try:
        start_together(servers, tmp)
        assert '"kv_role": "kv_producer"' in " ".join(servers[0].command())
        assert '"kv_role": "kv_both"' in " ".join(servers[1].command())
        yield [s.url for s in servers]
    finally:
        for s in servers:
            s.stop()


def sources(url: str) -> dict[str, int]:
    return prompt_token_sources(httpx.get(f"{url}/metrics", headers=engine_headers()).text)


def delta(after: dict[str, int], before: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def answer(url: str, content: str) -> tuple[list[int], list[float], int]:
    """One program's first turn at T=0: its completion ids, logprobs and prompt tokens."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    made = httpx.post(
        f"{url}/programs", json={"sampling": {"temperature": 0.0, "max_tokens": 12}}, headers=admin
    )
    assert made.status_code == 201, made.text
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
    key = {"Authorization": f"Bearer {made.json()['api_key']}"}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=key, timeout=600)
    assert r.status_code == 200, r.text
    t = Trajectory.model_validate(
        httpx.get(f"{url}/programs/{made.json()['id']}/trajectory", headers=admin).json()
    )
    return t.turns[0].completion_ids, t.turns[0].completion_logprobs, r.json()["usage"]["prompt_tokens"]


def test_the_decode_engine_loads_the_prompt_the_prefill_engine_computed(
    engines: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    pre, dec = engines
    rng = random.Random(7)
    content = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(400))
    tok = FastTokenizer(tiny_model_dir)
    split = build_gateway(
        {"pre": VLLMBackend(pre, name="pre"), "dec": VLLMBackend(dec, name="dec")}, tok,
        tmp_path / "pd.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=256,
    )  # fmt: skip
    url, server, thread = serve(split)
    try:
        b_pre, b_dec = sources(pre), sources(dec)
        ids, lps, prompt = answer(url, content)
        a_pre, a_dec = sources(pre), sources(dec)
    finally:
        server.should_exit = True
        thread.join(10)
    assert prompt >= 256 and split.pool.counts["pd_prefills"] == 1
    assert delta(a_pre, b_pre, "local_compute") == prompt  # the prefill engine computed it all
    loaded = delta(a_dec, b_dec, "external_kv_transfer")
    assert loaded == (prompt - 1) // BLOCK * BLOCK  # every full block of the prompt, from the pool
    assert delta(a_dec, b_dec, "local_compute") == prompt - loaded
    # colocated: the same prompt served whole by one engine (the prefill engine, as role both)
    alone = build_gateway({"pre": VLLMBackend(pre, name="pre")}, tok, tmp_path / "one.db", ADMIN, "tiny")
    url, server, thread = serve(alone)
    try:
        ids1, lps1, _ = answer(url, content)
    finally:
        server.should_exit = True
        thread.join(10)
    assert ids == ids1
    assert max(abs(x - y) for x, y in zip(lps, lps1, strict=True)) < 1e-4
