"""The bench's floor relay passes the engine's answer through unchanged (real vLLM behind)."""

from __future__ import annotations

import httpx
import pytest

from rollyard.bench._procs import _floor
from rollyard.core.engine_key import engine_headers

pytestmark = pytest.mark.engine


def test_the_floor_relay_returns_what_the_engine_returns(vllm_url: str) -> None:
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.0}
    direct = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=60, headers=engine_headers())
    with _floor(vllm_url) as (url, pid):
        relayed = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        bad = httpx.post(f"{url}/v1/completions", content=b"{not json", timeout=60)
    assert pid > 0
    assert relayed.status_code == direct.status_code == 200
    assert relayed.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
    assert relayed.json()["usage"] == direct.json()["usage"]
    assert (
        bad.status_code
        == httpx.post(
            f"{vllm_url}/v1/completions", content=b"{not json", timeout=60, headers=engine_headers()
        ).status_code
    )
