"""Context management through the gateway: the white-box agent's policy fires, the model is told
in-context, the gateway starts a new segment, and ``drop_thinking`` really removes the earlier
reasoning from what the engine sees (scripted engine: a random model never writes reasoning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from tests.gateway.conftest import ADMIN, ScriptedBackend

from rollyard.agents.context import NOTE_PREFIX, ContextPolicy, PolicyKind
from rollyard.agents.loop import AgentConfig, ExitReason, WhiteBoxAgent
from rollyard.core import EventKind
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.sandbox.base import SandboxSpec

CALL = '<tool_call>{"name": "bash", "arguments": {"command": "echo hi"}}</tool_call>'


@pytest.fixture
def provider() -> object:
    bwrap = pytest.importorskip("rollyard.sandbox.bwrap")
    try:
        return bwrap.BwrapProvider()
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")


async def _run(
    policy: PolicyKind, engine: ScriptedBackend, tok: FastTokenizer, tmp: Path, sb: object
) -> tuple[Any, Any]:
    gw = build_gateway({"fake": engine}, tok, tmp / "journal.db", ADMIN, "tiny")
    app = create_app(gw, poll_interval_s=0.05)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw:8000") as http,
    ):
        r = await http.post("/programs", json={}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 201, r.text
        program = r.json()
        client = AsyncOpenAI(base_url="http://gw:8000/v1", api_key=program["api_key"], http_client=http)
        cfg = AgentConfig(model="tiny", policies=[ContextPolicy(kind=policy, fraction=None)], max_turns=3)
        result = await WhiteBoxAgent(client, cfg).run("say hi", sb)  # type: ignore[arg-type]
        return result, gw.journal.trajectory(program["id"])


async def test_drop_thinking_removes_earlier_reasoning_from_the_engine_prompt(
    engine: ScriptedBackend, tok: FastTokenizer, tmp_path: Path, provider: object
) -> None:
    engine.script = [f"<think>SECRET plan</think>{CALL}", "done"]
    sb = await provider.create(SandboxSpec())  # type: ignore[attr-defined]
    try:
        result, traj = await _run(PolicyKind.DROP_THINKING, engine, tok, tmp_path, sb)
    finally:
        await sb.close()
    assert result.exit_reason == ExitReason.FINAL_ANSWER
    first, second = (tok.decode(p) for p in engine.prompts)
    assert "SECRET" not in first and "SECRET" not in second  # the engine never saw it again
    assert NOTE_PREFIX in second and "drop_thinking" in second  # the model is told
    assert len(traj.segments) == 2  # the rewrite started a new segment
    (gateway_rewrite,) = [e for e in traj.events if e.kind == EventKind.CONTEXT_REWRITE]
    (agent_rewrite,) = [e for e in result.events if e.kind == EventKind.CONTEXT_REWRITE]
    assert gateway_rewrite.turn_index == agent_rewrite.turn_index == 1
    assert agent_rewrite.payload.reason == "policy:drop_thinking"
