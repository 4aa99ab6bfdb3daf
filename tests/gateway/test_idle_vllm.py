"""The program idle TTL on a real vLLM: a program that stops talking is ended (journal and
metrics say so) while one that keeps talking is served throughout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollyard.engines import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.idle import IDLE_STATUS
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, serving

pytestmark = [pytest.mark.engine]
HI = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gateway(vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("idle") / "journal.db"
    gw = build_gateway(
        {"vllm": VLLMBackend(vllm_url, name="vllm")}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny"
    )
    with serving(create_app(gw, poll_interval_s=0.5, limits=GatewayLimits(program_idle_ttl_s=3.0))) as url:
        yield url


def test_an_idle_program_is_ended_and_a_talking_one_is_not(gateway: str) -> None:
    admin = {"x-api-key": ADMIN}
    quiet, busy = (httpx.post(f"{gateway}/programs", json={}, headers=admin).json() for _ in range(2))
    for p in (quiet, busy):
        r = httpx.post(
            f"{gateway}/v1/chat/completions", json=HI, headers={"x-api-key": p["api_key"]}, timeout=120
        )
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    state = "active"
    while state == "active" and time.monotonic() < deadline:
        r = httpx.post(
            f"{gateway}/v1/chat/completions", json=HI, headers={"x-api-key": busy["api_key"]}, timeout=120
        )
        assert r.status_code == 200, r.text
        state = httpx.get(f"{gateway}/programs/{quiet['id']}", headers=admin).json()["state"]
        time.sleep(0.5)
    q = httpx.get(f"{gateway}/programs/{quiet['id']}", headers=admin).json()
    assert q["state"] == "terminated" and q["status"] == IDLE_STATUS, q
    assert httpx.get(f"{gateway}/programs/{busy['id']}", headers=admin).json()["state"] == "active"
    metrics = httpx.get(f"{gateway}/metrics", headers=admin).text
    assert "rollyard_gateway_programs_idle_ended_total 1.0" in metrics
    traj = httpx.get(f"{gateway}/programs/{quiet['id']}/trajectory", headers=admin).json()
    assert sum(len(s["turns"]) for s in traj["segments"]) == 1  # its turn stays in the journal
