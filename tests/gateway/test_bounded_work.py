"""A huge prompt costs its own request, not everyone's: /health stays fast meanwhile."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_a_body_of_a_quarter_million_empty_messages_is_refused_without_stalling_the_loop(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    """Issue 45, class 5: ~240,000 empty messages (7.9 MB, under the body limit, no text to
    offload) held /health and every program for seconds: parsed, validated and rendered on the
    loop. Now a body with more JSON objects and arrays than ``max_body_objects`` is a 400 before
    it is parsed, on each API."""
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    empty = [{"role": "user", "content": ""}] * 240_000
    bodies = {  # encoded before the clock starts: the server shares this process's GIL
        "/v1/chat/completions": json.dumps({"messages": empty}).encode(),
        "/v1/messages": json.dumps({"max_tokens": 4, "messages": empty}).encode(),
        "/v1/responses": json.dumps({"input": empty}).encode(),
    }
    with serving(create_app(gw, limits=GatewayLimits())) as url:
        key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
        stop, lat = threading.Event(), []
        poller = threading.Thread(target=health_latencies, args=(url, stop, lat))
        poller.start()
        time.sleep(0.2)
        answers = {}
        for path, content in bodies.items():
            r = httpx.post(
                f"{url}{path}",
                content=content,
                headers={"x-api-key": key, "content-type": "application/json"},
                timeout=120,
            )
            answers[path] = (r.status_code, r.text[:200])
        time.sleep(0.1)
        stop.set()
        poller.join()
    for path, (status, text) in answers.items():
        assert status == 400 and "max_body_objects" in text, (path, status, text)
    # Counting brackets in 7.9 MB takes ~10 ms; parsing, validating and rendering took seconds.
    assert max(lat) < 0.25, sorted(lat)[-5:]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/responses"]),
    n_messages=st.integers(1, 40),
    parts=st.integers(0, 4),
    limit=st.integers(4, 120),
)
def test_bodies_over_the_object_limit_are_400_and_under_it_are_served(
    small_limit_app: tuple[str, str, list[int]], path: str, n_messages: int, parts: int, limit: int
) -> None:
    url, key, limit_box = small_limit_app
    limit_box[0] = limit
    if parts:
        kind = "input_text" if path == "/v1/responses" else "text"
        content: Any = [{"type": kind, "text": "hi"}] * parts
    else:
        content = "hi"
    messages = [{"role": "user", "content": content}] * n_messages
    body: dict[str, Any] = {"messages": messages, "max_tokens": 4}
    if path == "/v1/responses":
        body = {"input": messages, "max_output_tokens": 4}
    raw = json.dumps(body).encode()
    containers = raw.count(b"{") + raw.count(b"[")
    r = httpx.post(url + path, content=raw, headers={"x-api-key": key, "content-type": "application/json"})
    if containers > limit:
        assert r.status_code == 400 and "max_body_objects" in r.text, (containers, limit, r.text[:200])
    else:
        assert r.status_code == 200, (containers, limit, r.status_code, r.text[:200])


@pytest.fixture(scope="module")
def small_limit_app(
    tok: FastTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, list[int]]]:
    """A gateway whose ``max_body_objects`` a test may change between requests (through the
    app's own limits object, as a restart with another setting would)."""
    gw = build_gateway(
        {"fake": ScriptedBackend(tok, max_model_len=100_000)},
        tok,
        tmp_path_factory.mktemp("lim") / "j.db",
        ADMIN,
        "tiny",
    )
    limits = GatewayLimits(error_budget=0)
    app = create_app(gw, limits=limits)
    box = [limits.max_body_objects]
    with serving(app) as url:
        key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]

        def current() -> int:
            return box[0]

        app.state.limits = _LiveLimits(limits, current)
        yield url, key, box


class _LiveLimits:
    """The app's limits, with ``max_body_objects`` read from a test's box at each request."""

    def __init__(self, base: GatewayLimits, current: Callable[[], int]) -> None:
        self._base, self._current = base, current

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    @property
    def max_body_objects(self) -> int:
        return self._current()
