"""One program's faults end the program, not the run: a hung model call, a dead engine."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rollyard.agents.loop import AgentConfig
from rollyard.rollout.episode import ENGINE_FAILURE, act_and_evaluate
from rollyard.sandbox.bwrap import BwrapProvider
from rollyard.tasks import generate, load_task, prepare
from rollyard.tasks.model import Task

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return load_task(generate("lookup", tmp_path / "tasks", 1, seed=5)[0])


@pytest.fixture
def provider() -> BwrapProvider:
    try:
        return BwrapProvider(Path(tempfile.mkdtemp(prefix="ry-rollout-test-")))
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")


async def _serve(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


async def _hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(65536)
    await asyncio.sleep(3600)  # accepts the request, never answers


async def _drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()  # the engine went away mid-connection


async def _run(task: Task, provider: BwrapProvider, url: str, timeout_s: float) -> object:
    sb = await prepare(task, provider)
    try:
        return await act_and_evaluate(
            task, sb, provider, base_url=url, api_key="k", agent=AgentConfig(max_turns=2), timeout_s=timeout_s
        )
    finally:
        await sb.close()


async def test_a_hung_agent_is_terminated_and_scored_as_it_stands(
    task: Task, provider: BwrapProvider
) -> None:
    async for url in _serve(_hang):
        t0 = asyncio.get_running_loop().time()
        res = await _run(task, provider, url, timeout_s=1.5)
        assert asyncio.get_running_loop().time() - t0 < 30
    assert res.status == "timeout"  # type: ignore[attr-defined]
    assert res.outcome.passed is False and res.outcome.status == "failure"  # type: ignore[attr-defined]
    assert not [p for p in provider.root.iterdir() if not p.name.startswith(".")]


async def test_a_dead_engine_is_reported_so_the_program_can_be_rerun(
    task: Task, provider: BwrapProvider
) -> None:
    async for url in _serve(_drop):
        res = await _run(task, provider, url, timeout_s=30)
    assert res.status == ENGINE_FAILURE  # type: ignore[attr-defined]
    assert res.engine_failed  # type: ignore[attr-defined]
