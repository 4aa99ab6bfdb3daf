"""How ``VLLMBackend`` classifies an engine's failures (a scripted HTTP server, this module only).

An error the engine answers one request with belongs to that request (4xx: the request's
fault; 5xx: ``EngineError``); only a failed connection or a timeout says the engine is
unavailable. A hanging engine times out cleanly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from rollyard.core import EngineError, EngineUnavailable, InvalidRequest, SamplingParams
from rollyard.core.net import free_port
from rollyard.engines import VLLMBackend

P = SamplingParams(max_tokens=4)
MODELS = {"data": [{"id": "m", "max_model_len": 128}]}


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, dict]]:
    """A fake engine answering each completion with ``script['completions']`` (status, body)."""
    release = asyncio.Event()
    script: dict = {"completions": (200, "{}"), "metrics": (200, "")}

    async def models(_: web.Request) -> web.Response:
        return web.json_response(MODELS)

    async def completions(request: web.Request) -> web.StreamResponse:
        status, body = script["completions"]
        if status == 0:  # hang
            await release.wait()
        if status == 200 and (await request.json()).get("stream"):
            return web.Response(text=f"data: {body}\n\n", content_type="text/event-stream")
        return web.Response(status=status, text=body, content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        status, body = script["metrics"]
        return web.Response(status=status, text=body)

    app = web.Application()
    app.add_routes(
        [
            web.get("/v1/models", models),
            web.post("/v1/completions", completions),
            web.get("/metrics", metrics),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", script
    release.set()
    await runner.cleanup()


async def run_both(b: VLLMBackend) -> list[BaseException]:
    out: list[BaseException] = []
    for call in (b.generate([1, 2], P), _drain(b.stream([1, 2], P))):
        try:
            await call
        except Exception as e:
            out.append(e)
    return out


async def _drain(it: AsyncIterator[object]) -> None:
    async for _ in it:
        pass


@pytest.mark.parametrize(
    "status, body, kind",
    [
        (500, '{"error": "sampling params out of range"}', EngineError),
        (503, "overloaded", EngineError),
        (400, '{"error": "top_k must be >= -1"}', InvalidRequest),
        (422, '{"detail": "bad"}', InvalidRequest),
        (200, "not json", EngineError),
        (200, '{"choices": "nope"}', EngineError),
    ],
)
async def test_an_answered_error_belongs_to_the_request(
    engine: tuple[str, dict], status: int, body: str, kind: type
) -> None:
    url, script = engine
    script["completions"] = (status, body)
    b = VLLMBackend(url)
    try:
        errors = await run_both(b)
        assert len(errors) == 2
        for e in errors:
            assert isinstance(e, kind) and not isinstance(e, EngineUnavailable), repr(e)
    finally:
        await b.aclose()


async def test_a_failing_stats_poll_or_a_dead_engine_is_unavailable(engine: tuple[str, dict]) -> None:
    url, script = engine
    script["metrics"] = (500, "down")
    b = VLLMBackend(url)
    try:
        with pytest.raises(EngineUnavailable):
            await b.stats()
    finally:
        await b.aclose()
    dead = VLLMBackend(f"http://127.0.0.1:{free_port()}", model="m", max_model_len=128)
    try:
        with pytest.raises(EngineUnavailable):
            await dead.generate([1, 2], P)
    finally:
        await dead.aclose()


async def test_a_hanging_engine_times_out_cleanly(engine: tuple[str, dict]) -> None:
    url, script = engine
    script["completions"] = (0, "")
    b = VLLMBackend(url, timeout_s=0.5)
    try:
        started = asyncio.get_running_loop().time()
        errors = await run_both(b)
        assert [type(e) for e in errors] == [EngineUnavailable, EngineUnavailable]
        assert all("time" in str(e).lower() for e in errors), errors
        assert asyncio.get_running_loop().time() - started < 5
        script["completions"] = (
            200,
            '{"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-1.0]}}]}',
        )
        c = await b.generate([1, 2], P)  # the engine answers again: so does the backend
        assert c.token_ids == [5]
    finally:
        await b.aclose()
