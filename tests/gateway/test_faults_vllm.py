"""Faults on a real vLLM engine of this module's own (it is stopped and killed here).

- out-of-range sampling parameters never reach the engine (400) and leave it serving;
- an engine that hangs without dying (SIGSTOP): the request times out with a clean 503 and
  Retry-After, the engine's breaker opens (metric), and the program's retry succeeds once the
  engine resumes (SIGCONT);
- an engine killed mid-stream: the stream ends with an error event, not a hang, and the
  gateway keeps answering.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollyard.core.engine_key import engine_headers
from rollyard.engines import VLLMBackend
from rollyard.engines.launcher import VLLMServer
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, serving

pytestmark = [pytest.mark.engine, pytest.mark.slow]
HI = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    log = tmp_path_factory.mktemp("vllm-faults") / "vllm.log"
    with VLLMServer(
        tiny_model_dir, kv_tokens=8192, max_model_len=2048, served_name="tiny", log_path=log
    ) as s:
        # The first requests of a fresh CPU engine on a loaded host can outlast the short
        # timeout the hang test needs: warm it up with a patient client first.
        body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4}
        for _ in range(3):
            httpx.post(
                f"{s.url}/v1/completions", json=body, timeout=300, headers=engine_headers()
            ).raise_for_status()
        yield s


@pytest.fixture(scope="module")
def gateway(
    engine: VLLMServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    backend = VLLMBackend(engine.url, name="vllm", timeout_s=20.0)
    db = tmp_path_factory.mktemp("gw") / "journal.db"
    gw = build_gateway({"vllm": backend}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny")
    limits = GatewayLimits(breaker_base_s=1.0, breaker_max_s=4.0, error_budget=0, engine_timeout_s=20.0)
    with serving(create_app(gw, poll_interval_s=0.5, limits=limits)) as url:
        yield url


def new_key(url: str) -> str:
    return httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"x-api-key": ADMIN}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def chat(url: str, key: str, body: dict = HI, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=timeout)


def wait_ok(url: str, key: str, limit_s: float = 180) -> httpx.Response:
    deadline = time.monotonic() + limit_s
    while True:
        r = chat(url, key)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(float(r.headers.get("retry-after", "1")))


@pytest.mark.parametrize(
    "bad",
    [{"temperature": 5.0}, {"top_p": 0.0}, {"top_k": -5}, {"max_tokens": 0}, {"seed": 2**70}, {"top_p": "x"}],
)
def test_out_of_range_sampling_is_400_and_the_engine_keeps_serving(gateway: str, bad: dict) -> None:
    key = new_key(gateway)
    r = chat(gateway, key, {**HI, **bad})
    assert r.status_code == 400, r.text
    assert httpx.get(f"{gateway}/health").json()["status"] == "ok"
    r = chat(gateway, new_key(gateway))
    assert r.status_code == 200, r.text


def test_a_hanging_engine_times_out_cleanly_and_the_program_retries(gateway: str, engine: VLLMServer) -> None:
    key = new_key(gateway)
    assert chat(gateway, key).status_code == 200
    opens = metric(gateway, 'rollyard_engine_breaker_opens_total{engine="vllm"}')
    assert engine.proc is not None
    os.killpg(engine.proc.pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        r = chat(gateway, key)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
        assert int(r.headers["retry-after"]) >= 1 and time.monotonic() - t < 60
        assert httpx.get(f"{gateway}/health", timeout=5).status_code == 200  # the gateway itself answers
        assert metric(gateway, 'rollyard_engine_breaker_opens_total{engine="vllm"}') > opens
    finally:
        os.killpg(engine.proc.pid, signal.SIGCONT)
    r = wait_ok(gateway, key)
    assert r.status_code == 200, r.text
    assert metric(gateway, 'rollyard_engine_breaker_open{engine="vllm"}') == 0


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(gateway: str, engine: VLLMServer) -> None:
    key = new_key(gateway)
    body = {
        "messages": [{"role": "user", "content": "tell a long story"}],
        "max_tokens": 1500,
        "stream": True,
    }
    chunks, error = 0, None
    with httpx.stream(
        "POST", f"{gateway}/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=60
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                error = data["error"]
                break
            chunks += 1
            if chunks == 5:
                engine.kill()
    assert chunks >= 5 and error is not None and error["code"] == "engine_unavailable", (chunks, error)
    t = time.monotonic()
    assert httpx.get(f"{gateway}/health", timeout=5).json()["status"] == "degraded"
    assert time.monotonic() - t < 1.0
    r = chat(gateway, key)
    assert r.status_code == 503 and "retry-after" in r.headers
