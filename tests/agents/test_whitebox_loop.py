from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from rollyard.agents import (
    AgentConfig,
    ContextPolicy,
    ExitReason,
    PolicyKind,
    WhiteBoxAgent,
    run_tool,
    truncate,
)
from rollyard.core import EventKind
from rollyard.sandbox.base import SandboxProvider, SandboxSpec


def _call(name: str, args: str, i: int = 0) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def _client(replies: list[dict[str, Any]], seen: list[dict[str, Any]], status: int = 200) -> AsyncOpenAI:
    """An SDK client whose endpoint answers request i with replies[i] (a chat message)."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"auth": request.headers["authorization"], **body})
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "maximum context length exceeded"}})
        msg = replies[len(seen) - 1]
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", **msg}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 500, "completion_tokens": 10, "total_tokens": 510},
            },
        )

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return AsyncOpenAI(base_url="http://gw/v1", api_key="sk-prog", http_client=http, max_retries=0)


def test_truncation_keeps_head_and_tail() -> None:
    text = "a" * 100 + "b" * 100
    out = truncate(text, 50)
    assert out.startswith("a" * 25) and out.endswith("b" * 25) and "150 characters truncated" in out
    assert truncate("short", 50) == "short"


@pytest.mark.parametrize(
    ("name", "args", "needle"),
    [
        ("rm_rf", "{}", "unknown tool 'rm_rf'"),
        ("bash", "{not json", "not valid JSON"),
        ("bash", "[1]", "must be a JSON object"),
        ("bash", "[" * 100_000, "nested too deeply"),
        ("write_file", '{"path": "a"}', "needs string argument(s) content"),
    ],
)
async def test_malformed_tool_calls_are_answered_with_an_error(
    provider: SandboxProvider, name: str, args: str, needle: str
) -> None:
    sb = await provider.create(SandboxSpec())
    try:
        out = await run_tool(sb, name, args, timeout=10, max_chars=500)
    finally:
        await sb.close()
    assert out.error and needle in out.content


async def test_the_loop_runs_tools_in_the_sandbox_until_submit(provider: SandboxProvider) -> None:
    replies = [
        {"content": None, "tool_calls": [_call("grep_all", "{}", 0)]},
        {"content": None, "tool_calls": [_call("bash", json.dumps({"command": "echo 42 > answer.txt"}), 1)]},
        {"content": None, "tool_calls": [_call("submit", json.dumps({"answer": "42"}), 2)]},
    ]
    seen: list[dict[str, Any]] = []
    agent = WhiteBoxAgent(_client(replies, seen), AgentConfig(model="m", max_turns=5))
    sb = await provider.create(SandboxSpec())
    try:
        result = await agent.run("write 42 to answer.txt", sb)
        answer = (await sb.read("answer.txt")).decode()
    finally:
        await sb.close()
    assert answer == "42\n"
    assert (result.exit_reason, result.submitted, result.final_answer) == (ExitReason.SUBMITTED, True, "42")
    assert (result.turns, result.tool_calls, result.malformed_tool_calls) == (3, 3, 1)
    assert all(s["auth"] == "Bearer sk-prog" for s in seen)
    assert "unknown tool" in seen[1]["messages"][-1]["content"]
    results = [e.payload for e in result.events]
    assert [e.kind for e in result.events] == [EventKind.TOOL_RESULT] * 3
    assert [(r.name, r.malformed, r.is_error, r.exit_code) for r in results] == [
        ("grep_all", True, True, None),
        ("bash", False, False, 0),
        ("submit", False, False, None),
    ]
    assert [r.call_id for r in results] == ["call_0", "call_1", "call_2"]


async def test_a_context_rewrite_is_applied_and_recorded_as_an_event(provider: SandboxProvider) -> None:
    replies = [
        {"content": "<think>x</think>look", "tool_calls": [_call("bash", '{"command": "ls"}', 0)]},
        {"content": "done"},
    ]
    seen: list[dict[str, Any]] = []
    cfg = AgentConfig(context_limit=1000, policies=[ContextPolicy(kind=PolicyKind.DISCARD_ALL, fraction=0.3)])
    sb = await provider.create(SandboxSpec())
    try:
        result = await WhiteBoxAgent(_client(replies, seen), cfg).run("task", sb)
    finally:
        await sb.close()
    assert result.exit_reason is ExitReason.FINAL_ANSWER and result.final_answer == "done"
    rewrites = [e for e in result.events if e.kind is EventKind.CONTEXT_REWRITE]
    assert len(rewrites) == 1 and rewrites[0].data["policy"] == "discard_all"
    assert rewrites[0].turn_index == 1 and rewrites[0].data["messages_after"] == 3
    # the history is gone and the model is told so, right after the task
    assert [m["role"] for m in seen[1]["messages"]] == ["system", "user", "user"]
    assert seen[1]["messages"][-1]["content"].startswith("[context compacted #1 by discard_all")


async def test_the_loop_stops_at_max_turns_and_on_endpoint_errors(provider: SandboxProvider) -> None:
    replies = [{"content": None, "tool_calls": [_call("bash", '{"command": "true"}', i)]} for i in range(3)]
    sb = await provider.create(SandboxSpec())
    try:
        capped = await WhiteBoxAgent(_client(replies, []), AgentConfig(max_turns=2)).run("t", sb)
        failed = await WhiteBoxAgent(_client([], [], status=400), AgentConfig()).run("t", sb)
    finally:
        await sb.close()
    assert (capped.exit_reason, capped.turns, capped.submitted) == (ExitReason.MAX_TURNS, 2, False)
    assert failed.exit_reason is ExitReason.CONTEXT_EXCEEDED and failed.error


async def test_the_opening_runs_first_and_only_the_required_turns_are_forced(
    provider: SandboxProvider,
) -> None:
    replies = [
        {"content": None, "tool_calls": [_call("bash", json.dumps({"command": "echo hi"}), 0)]},
        {"content": None, "tool_calls": [_call("bash", json.dumps({"command": "echo again"}), 1)]},
        {"content": "a free-text answer"},
    ]
    seen: list[dict[str, Any]] = []
    cfg = AgentConfig(tool_choice="required", required_turns=2, opening=["echo opened > seen.txt"])
    sb = await provider.create(SandboxSpec())
    try:
        result = await WhiteBoxAgent(_client(replies, seen), cfg).run("task", sb)
        opened = (await sb.read("seen.txt")).decode()
    finally:
        await sb.close()
    assert opened == "opened\n"  # the opening ran in the sandbox, before the model's first turn
    first = seen[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "tool"]
    assert json.loads(first[2]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "echo opened > seen.txt"
    }
    assert "[exit 0]" in first[3]["content"]
    assert [s.get("tool_choice") for s in seen] == ["required", "required", None]
    assert (result.exit_reason, result.turns, result.tool_calls) == (ExitReason.FINAL_ANSWER, 3, 2)
    assert [e.payload.call_id for e in result.events] == ["opening-0", "call_0", "call_1"]
    # the opening follows no model turn: no turn is penalised or chunked for it
    assert [e.turn_index for e in result.events] == [None, 0, 1]


async def test_a_named_tool_choice_forces_that_tool_in_the_required_turns(provider: SandboxProvider) -> None:
    replies = [
        {"content": None, "tool_calls": [_call("bash", json.dumps({"command": "echo hi"}), 0)]},
        {"content": "free text"},
    ]
    seen: list[dict[str, Any]] = []
    cfg = AgentConfig(tool_choice="bash", required_turns=1)
    sb = await provider.create(SandboxSpec())
    try:
        result = await WhiteBoxAgent(_client(replies, seen), cfg).run("task", sb)
    finally:
        await sb.close()
    named = {"type": "function", "function": {"name": "bash"}}
    assert [s.get("tool_choice") for s in seen] == [named, None]
    assert result.exit_reason == ExitReason.FINAL_ANSWER
    with pytest.raises(ValueError, match="tool_choice"):
        AgentConfig(tool_choice="rm")  # type: ignore[arg-type]
