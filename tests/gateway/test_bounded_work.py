"""A huge prompt costs its own request, not everyone's: /health stays fast meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend, serving


def health_latencies(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        while not stop.is_set():
            t = time.perf_counter()
            c.get("/health").raise_for_status()
            out.append(time.perf_counter() - t)
            time.sleep(0.01)


def test_a_prompt_too_long_for_any_tokenization_is_refused_without_tokenizing(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    with serving(create_app(gw, limits=GatewayLimits())) as url:
        key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
        body = {"messages": [{"role": "user", "content": "word " * 1_000_000}]}  # 5 MB
        t = time.perf_counter()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert time.perf_counter() - t < 2.0  # tokenizing 5 MB takes ~30 s here
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "w" * 2_000_000}, headers={"x-api-key": key})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_health_stays_fast_while_a_large_prompt_is_tokenized(tok: FastTokenizer, tmp_path: Path) -> None:
    engine = ScriptedBackend(tok, max_model_len=1_000_000)  # a long-context engine: it must be tokenized
    gw = build_gateway({"fake": engine}, tok, tmp_path / "j.db", ADMIN, "tiny")
    text = "word another thing " * 16_000  # ~300 kB, doubled until tokenizing it takes >= 0.5 s here
    for _ in range(6):
        started = time.perf_counter()
        tok.encode(text)
        tokenize_s = time.perf_counter() - started
        if tokenize_s > 0.5:
            break
        text += text
    with serving(create_app(gw, limits=GatewayLimits())) as url:
        key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
        stop, lat = threading.Event(), []
        poller = threading.Thread(target=health_latencies, args=(url, stop, lat))
        poller.start()
        time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=120)
        stop.set()
        poller.join()
    assert r.status_code == 200, r.text[:300]
    assert tokenize_s > 0.5, tokenize_s  # long enough that an event-loop stall would show
    # A stalled loop would hold /health for about the whole tokenization (measured: 1.6 of 2.0 s).
    assert max(lat) < max(0.25, tokenize_s / 2), (max(lat), tokenize_s)
