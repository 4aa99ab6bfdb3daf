"""Two real engines sharing ``engine.kv_pool``: one loads the prefix the other computed.

Counts come from the engines' own ``/metrics`` (``vllm:prompt_tokens_by_source_total``); the
loading engine's T=0 tokens and logprobs must equal those the computing engine produced cold.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollyard.core.engine_key import engine_headers
from rollyard.engines.kvpool import KVPoolConfig
from rollyard.engines.kvpool.mooncake import MooncakeMaster, master_binary
from rollyard.engines.launcher import VLLMServer, start_together
from rollyard.engines.metrics import prompt_token_sources

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BLOCK = 64


def _mooncake_installed() -> bool:
    try:
        master_binary()
    except Exception:
        return False
    return True


@pytest.fixture(scope="module", params=["local", "mooncake"])
def engine_pair(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp(f"kvpool-{request.param}")
    master = None
    if request.param == "mooncake":
        if not _mooncake_installed():
            pytest.skip("mooncake-transfer-engine-non-cuda is not installed")
        if not os.environ.get("ROLLYARD_TEST_MOONCAKE"):
            # Known problem (2026-12-06): in the full suite, and once alone, the second engine
            # loaded 0 of the shared blocks from Mooncake's store (this module's two tests: 2 of 4
            # runs failed), while the bench's workload loaded them; our own connector passes every
            # time. Run it by hand with ROLLYARD_TEST_MOONCAKE=1 until that is understood.
            pytest.skip("opt-in (ROLLYARD_TEST_MOONCAKE=1): its loads are not yet reliable")
        master = MooncakeMaster(tmp / "master.log").start()
        pool = KVPoolConfig(kind="mooncake", master=master.address, segment_mb=128)
    else:
        pool = KVPoolConfig(kind="local", root=str(tmp / "pool"))
    servers = [
        VLLMServer(
            tiny_model_dir,
            kv_tokens=4096,
            max_model_len=1024,
            served_name="tiny",
            log_path=tmp / f"e{i}.log",
            kv_pool=pool,
            startup_timeout_s=900,  # two engines at once on a shared 2-core box
        )
        for i in range(2)
    ]
    try:
        start_together(servers, tmp)
        yield servers[0].url, servers[1].url
    finally:
        for s in servers:
            s.stop()
        if master is not None:
            master.stop()


def _run(url: str, prompt: list[int]) -> dict[str, Any]:
    before = prompt_token_sources(httpx.get(f"{url}/metrics", headers=engine_headers()).text)
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "logprobs": 1,
              "return_token_ids": True, "ignore_eos": True},
        timeout=300, headers=engine_headers(),
    )  # fmt: skip
    r.raise_for_status()
    after = prompt_token_sources(httpx.get(f"{url}/metrics", headers=engine_headers()).text)
    choice = r.json()["choices"][0]
    return {
        "tokens": choice["token_ids"],
        "logprobs": choice["logprobs"]["token_logprobs"],
        **{k: after.get(k, 0) - before.get(k, 0) for k in ("local_compute", "external_kv_transfer")},
    }


def test_an_engine_loads_the_prefix_another_computed(engine_pair: tuple[str, str]) -> None:
    a, b = engine_pair
    rng = random.Random(5)
    prompt = [rng.randrange(10, 1000) for _ in range(300)]
    cold = _run(a, prompt)
    assert cold["external_kv_transfer"] == 0 and cold["local_compute"] == 300
    warm = _run(b, prompt)
    assert warm["external_kv_transfer"] == (300 - 1) // BLOCK * BLOCK  # 4 full blocks
    assert warm["local_compute"] == 300 - warm["external_kv_transfer"]
    assert warm["tokens"] == cold["tokens"]
    assert max(abs(x - y) for x, y in zip(warm["logprobs"], cold["logprobs"], strict=True)) < 1e-5


def test_a_shared_block_aligned_prefix_is_loaded_and_the_rest_computed(engine_pair: tuple[str, str]) -> None:
    a, b = engine_pair
    rng = random.Random(6)
    head = [rng.randrange(10, 1000) for _ in range(200)]
    _run(a, head + [rng.randrange(10, 1000) for _ in range(100)])
    other = head + [rng.randrange(10, 1000) for _ in range(150)]  # diverges inside block 4
    warm = _run(b, other)
    assert warm["external_kv_transfer"] == 200 // BLOCK * BLOCK  # the 3 whole shared blocks
    assert warm["local_compute"] == len(other) - warm["external_kv_transfer"]
