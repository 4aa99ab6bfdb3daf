"""A dedicated small-KV engine: KV pressure shows in stats, and a killed engine raises typed errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollyard.core import EngineStartError, EngineUnavailable, SamplingParams
from rollyard.engines import VLLMBackend, VLLMServer
from rollyard.engines.launcher import free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]


async def test_kv_pressure_then_kill(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = VLLMServer(tiny_model_dir, kv_tokens=2304, max_model_len=1024, log_path=tmp_path / "v.log")
    with server:
        backend = VLLMBackend(server.url)
        try:
            before = await backend.stats()
            assert before.kv_capacity_tokens >= 2304
            # 6 requests of 700 prompt + 100 output tokens cannot all fit 2304 KV tokens (two
            # can): the rest wait or are preempted. (12 of 1,000 tokens took ~60 s more of CI.)
            params = SamplingParams(max_tokens=100, temperature=1.0, seed=0, stop_token_ids=())
            prompts = [[(7 * i + j) % 1500 + 10 for j in range(700)] for i in range(6)]
            peak_usage = 0.0
            peak_waiting = 0

            async def watch() -> None:
                nonlocal peak_usage, peak_waiting
                while True:
                    s = await backend.stats()
                    peak_usage = max(peak_usage, s.kv_usage)
                    peak_waiting = max(peak_waiting, s.waiting)
                    await asyncio.sleep(0.2)

            watcher = asyncio.create_task(watch())
            results = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
            watcher.cancel()
            after = await backend.stats()
            assert all(len(r.token_ids) > 0 for r in results)
            assert peak_usage > 0.5
            assert after.preemptions > before.preemptions or peak_waiting > 0

            # Kill the engine mid-request: the caller gets the typed, retryable error.
            pending = asyncio.create_task(backend.generate(prompts[0], SamplingParams(max_tokens=1000)))
            await asyncio.sleep(0.5)
            server.kill()
            with pytest.raises(EngineUnavailable):
                await pending
            with pytest.raises(EngineUnavailable):
                await backend.stats()
            assert not await backend.health()
        finally:
            await backend.aclose()


def test_port_in_use_is_a_clear_start_error(tiny_model_dir: Path) -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(EngineStartError, match="in use"):
            VLLMServer(tiny_model_dir, port=port).start()


def test_engine_that_cannot_start_reports_its_log(tmp_path: Path, tiny_model_dir: Path) -> None:
    # A config vLLM rejects (the launcher itself checks the context length, so: a bad dtype):
    # the launcher must fail fast with the log tail, not hang.
    server = VLLMServer(
        tiny_model_dir, dtype="not-a-dtype", log_path=tmp_path / "bad.log", startup_timeout_s=120
    )
    with pytest.raises(EngineStartError, match="exited"):
        server.start()
    assert not server.alive()
