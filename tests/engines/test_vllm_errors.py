"""How ``VLLMBackend`` classifies an engine's failures (a scripted HTTP server, this module only).

An error the engine answers one request with belongs to that request (4xx: the request's
fault; 5xx: ``EngineError``); only a failed connection or a timeout says the engine is
unavailable. A hanging engine times out cleanly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from rollyard.core import EngineError, EngineUnavailable, InvalidRequest, SamplingParams
from rollyard.core.net import free_port
from rollyard.engines import VLLMBackend

P = SamplingParams(max_tokens=4)
MODELS = {"data": [{"id": "m", "max_model_len": 128}]}
ONE_ID_TWO_COUNTED = json.dumps(
    {
        "choices": [
            {
                "text": "a",
                "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1], "top_logprobs": [None]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2},
    }
)


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
        if status == -1:  # the head and one event, then a hang
            stalled = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stalled.prepare(request)
            await stalled.write(f"data: {body}\n\n".encode())
            await release.wait()
            return stalled
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
        # no ids at all (logprobs missing, as asked for with return_tokens_as_token_ids): not an empty turn
        (200, '{"choices": [{"text": "hello", "logprobs": null, "finish_reason": "stop"}]}', EngineError),
        (200, '{"choices": [{"text": "", "finish_reason": "stop"}]}', EngineError),
        # one id read where the engine counted two
        (200, ONE_ID_TWO_COUNTED, EngineError),
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


async def test_a_stream_that_stalls_midway_times_out_cleanly(engine: tuple[str, dict]) -> None:
    url, script = engine
    event = {"choices": [{"text": "a", "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1]}}]}
    script["completions"] = (-1, json.dumps(event))
    b = VLLMBackend(url, timeout_s=0.4)
    try:
        got = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineUnavailable, match="timed out"):
            async for d in b.stream([1, 2], P):
                got += d.token_ids
                first = loop.time()
        assert got == [5]  # the event before the stall was read
        # failed between 1 and 1.25 timeouts after the last byte (a little slack for the loop)
        assert 0.4 <= loop.time() - first < 0.4 * 1.25 + 0.3
        assert loop.time() - started < 5
    finally:
        await b.aclose()


COMPLETION = (
    '{"choices":[{"token_ids":[5,6],"finish_reason":"stop","logprobs":{"token_logprobs":[-0.5,-0.25]}}]}'
)


@pytest.fixture
async def racy() -> AsyncIterator[tuple[str, list[str]]]:
    """A raw HTTP/1.1 engine that closes a kept-alive connection as its second request arrives
    (the idle race: the server closed just as the client reused it), or with ``cut`` in the
    script, after sending the head of the answer. Answers everything else."""
    log: list[str] = []  # one entry per request: "<connection>:<n>:<path>"
    conns = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        me, n = conns, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                sizes = [int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")]
                size = sizes[0] if sizes else 0
                await reader.readexactly(size)
                n += 1
                path = lines[0].split()[1]
                log.append(f"{me}:{n}:{path}")
                body = (json.dumps(MODELS) if path == "/v1/models" else COMPLETION).encode()
                if n == 2 and "cut" not in log:
                    break  # closed without a byte of answer
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
                if "cut" in log and path == "/v1/completions":
                    writer.write(b"content-length: %d\r\n\r\n" % len(body) + body[:10])
                    await writer.drain()
                    break  # closed in the middle of the answer
                writer.write(b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    yield f"http://127.0.0.1:{port}", log
    server.close()


async def test_a_kept_alive_connection_closed_as_it_is_reused_is_resent_once(racy: tuple) -> None:
    url, log = racy
    b = VLLMBackend(url, name="e")
    await b.model_name()  # connection 1, kept alive
    out = await b.generate([1, 2, 3], P)  # reuses it: closed unanswered, then resent on a new one
    assert out.token_ids == [5, 6] and b.resent == 1
    assert log == ["1:1:/v1/models", "1:2:/v1/completions", "2:1:/v1/completions"]
    await b.aclose()


async def test_a_connection_cut_after_the_answer_began_is_not_resent(racy: tuple) -> None:
    url, log = racy
    log.append("cut")
    b = VLLMBackend(url, name="e")
    await b.model_name()
    with pytest.raises(EngineUnavailable):
        await b.generate([1, 2, 3], P)
    assert b.resent == 0 and sum("/v1/completions" in x for x in log) == 1
    await b.aclose()
