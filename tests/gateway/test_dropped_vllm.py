"""One dropped gateway->engine connection on a real vLLM leaves every other program served.

A TCP proxy between the gateway and the engine cuts one connection on command: before any
answer (the keep-alive idle race: the request is resent on a new connection and succeeds), or
in the middle of a streamed answer (that one request fails; nothing else does). In both cases
the engine is never marked down and its breaker never opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from rollyard.core.net import free_port
from rollyard.engines import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, serving

pytestmark = [pytest.mark.engine]


class CuttingProxy:
    """Relays TCP to the engine; ``arm("request")`` closes the next connection that carries a
    completion request before relaying it (aiohttp itself resends an idempotent GET, so only a
    POST shows the gateway's resend), ``arm("stream")`` closes the next one whose answer carries a
    stream event, right after relaying that first event."""

    def __init__(self, target: str) -> None:
        u = urlparse(target)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.mode: str | None = None
        self.cuts = 0
        self.listen = free_port()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def arm(self, mode: str) -> None:
        self.mode = mode

    def _cut(self, mode: str) -> bool:
        if self.mode != mode:
            return False
        self.mode, self.cuts = None, self.cuts + 1
        return True

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.listen))
        self._ready.set()
        self.loop.run_forever()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(self.host, self.port)

        async def up() -> None:
            while data := await cr.read(65536):
                if data.startswith(b"POST /v1/completions") and self._cut("request"):
                    return
                sw.write(data)
                await sw.drain()

        async def down() -> None:
            while data := await sr.read(65536):
                at = data.find(b"data: {")
                if at >= 0 and self._cut("stream"):
                    end = data.find(b"\n\n", at)  # relay the first event only: the answer is cut
                    cw.write(data[: end + 2] if end >= 0 else data)  # even if it all came at once
                    await cw.drain()
                    return
                cw.write(data)
                await cw.drain()

        with contextlib.suppress(ConnectionError):
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(up()), asyncio.ensure_future(down())],
                return_when=asyncio.FIRST_COMPLETED,
            )
            for t in pending:
                t.cancel()
        for w in (cw, sw):
            w.transport.abort()  # a reset, as a dying peer or a closed idle socket gives


@pytest.fixture(scope="module")
def proxied(vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    proxy = CuttingProxy(vllm_url)
    backend = VLLMBackend(proxy.url, name="vllm", timeout_s=120.0)
    db = tmp_path_factory.mktemp("gw") / "journal.db"
    gw = build_gateway({"vllm": backend}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny")
    with serving(create_app(gw, poll_interval_s=0.5, limits=GatewayLimits(error_budget=0))) as url:
        yield url, proxy, backend


def turn(url: str, stream: bool) -> str:
    """'ok', or what went wrong, for one new program's one turn."""
    key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
    body = {"messages": [{"role": "user", "content": "count to ten"}], "max_tokens": 24, "stream": stream}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=180
    ) as r:
        if r.status_code != 200:
            return f"status {r.status_code}: {r.read()[:200]!r}"
        for line in r.iter_lines():
            if line.startswith("data: {") and "error" in json.loads(line[6:]):
                return f"stream error: {line[:200]}"
    return "ok"


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"x-api-key": ADMIN}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def run_all(url: str, n: int, stream: bool) -> list[str]:
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(lambda _: turn(url, stream), range(n)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_connection_dropped_before_the_answer_is_resent_and_nobody_fails(
    proxied: tuple, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollyard")
    url, proxy, backend = proxied
    assert run_all(url, 4, stream) == ["ok"] * 4  # warm: connections kept alive
    cuts, resent = proxy.cuts, backend.resent
    proxy.arm("request")
    assert run_all(url, 12, stream) == ["ok"] * 12
    assert proxy.cuts == cuts + 1 and backend.resent == resent + 1
    assert metric(url, 'rollyard_engine_resends{engine="vllm"}') == backend.resent
    assert "engine down" not in caplog.text
    assert metric(url, 'rollyard_engine_breaker_opens_total{engine="vllm"}') == 0
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_a_stream_cut_mid_answer_fails_only_that_request(
    proxied: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollyard")
    url, proxy, _ = proxied
    cuts = proxy.cuts
    proxy.arm("stream")
    results = run_all(url, 12, stream=True)
    assert proxy.cuts == cuts + 1
    failed = [r for r in results if r != "ok"]
    # The cut request fails (tokens had reached its client) or, cut before its first token,
    # is retried; every other program is served.
    assert len(failed) <= 1 and all(r.startswith("stream error") for r in failed), results
    assert "engine down" not in caplog.text and "engine probe after a failed request" in caplog.text
    assert metric(url, 'rollyard_engine_breaker_opens_total{engine="vllm"}') == 0
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert run_all(url, 2, stream=True) == ["ok", "ok"]
