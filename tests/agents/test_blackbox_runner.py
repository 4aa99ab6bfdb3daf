"""The black-box runner end to end: real example agents (OpenAI SDK, Anthropic SDK, litellm) in a
bubblewrap sandbox, reaching a canned OpenAI/Anthropic-compatible server on a unix socket only
through the shipped forwarder. Plumbing proof; the real-gateway test lives beside it."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rollyard.agents.blackbox import BlackBoxRunner, load_profile, shipped_profiles
from rollyard.core.errors import ConfigError
from rollyard.sandbox.base import SandboxProvider

TOOL_CMD = "echo hello > out.txt"


class CannedServer:
    """Answers the first turn with a bash tool call and the second with the tool's output."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def _key(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        self.keys.append(auth.removeprefix("Bearer ") or request.headers.get("x-api-key", ""))

    async def chat(self, request: web.Request) -> web.Response:
        self._key(request)
        body = await request.json()
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            msg: dict[str, Any] = {"role": "assistant", "content": f"done: {results[-1].strip()}"}
        else:
            args = json.dumps({"command": TOOL_CMD})
            call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": args}}
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
        return web.json_response(
            {
                "id": "cmpl",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def messages(self, request: web.Request) -> web.Response:
        self._key(request)
        body = await request.json()
        results = [
            b["content"]
            for m in body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        if results:
            content: list[dict[str, Any]] = [{"type": "text", "text": f"done: {results[-1].strip()}"}]
            stop = "end_turn"
        else:
            content = [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {"command": TOOL_CMD}}]
            stop = "tool_use"
        return web.json_response(
            {
                "id": "msg",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )


@pytest.fixture()
async def server() -> AsyncIterator[tuple[CannedServer, Path]]:
    canned = CannedServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", canned.chat)
    app.router.add_post("/v1/messages", canned.messages)
    runner = web.AppRunner(app)
    await runner.setup()
    sock_dir = Path(tempfile.mkdtemp(prefix="ry-gw-", dir="/tmp"))
    os.chmod(sock_dir, 0o755)  # the sandbox's unprivileged uid must reach the socket
    sock = sock_dir / "gw.sock"
    await web.UnixSite(runner, str(sock)).start()
    os.chmod(sock, 0o777)
    try:
        yield canned, sock
    finally:
        await runner.cleanup()
        sock.unlink(missing_ok=True)
        sock_dir.rmdir()


def test_the_three_shipped_profiles_load() -> None:
    assert {"openai", "anthropic", "litellm"} <= set(shipped_profiles())
    with pytest.raises(ConfigError, match="no runner profile 'nope'"):
        load_profile("nope")


def test_a_profile_with_unsafe_hygiene_or_inconsistent_io_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\ncommand: [a]\nhygiene: ['$(rm -rf ~)']\n")
    with pytest.raises(ConfigError, match="plain relative path"):
        load_profile(bad)
    bad.write_text("name: x\ncommand: [a]\ntask_input: arg\n")
    with pytest.raises(ConfigError, match="needs"):
        load_profile(bad)


@pytest.mark.parametrize("name", ["openai", "anthropic", "litellm"])
async def test_a_real_sdk_agent_runs_in_the_sandbox_against_its_endpoint(
    provider: SandboxProvider, server: tuple[CannedServer, Path], name: str
) -> None:
    if name == "litellm" and importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm not installed")
    canned, sock = server
    runner = BlackBoxRunner(load_profile(name), sock)
    sb = await provider.create(runner.spec())
    try:
        result = await runner.run(sb, task="write hello to out.txt", api_key="sk-prog-1", model="policy")
        listing = await sb.snapshot()
        made = (await sb.read("out.txt")).decode()
    finally:
        await sb.close()
    assert result.rc == 0, result.stderr
    assert result.output is not None and result.output.startswith("done: [exit 0]")
    assert made == "hello\n"
    assert canned.keys and set(canned.keys) == {"sk-prog-1"}
    assert set(listing) == {"out.txt"}  # runner files and config templates removed by hygiene


async def test_the_sandboxed_agent_reaches_only_its_endpoint(
    provider: SandboxProvider, server: tuple[CannedServer, Path], tmp_path: Path
) -> None:
    _, sock = server
    probe = tmp_path / "probe.yaml"
    script = (
        "import socket\n"
        "for host, port in [('1.1.1.1', 53), ('127.0.0.1', 22), ('10.0.0.1', 80)]:\n"
        "    s = socket.socket(); s.settimeout(1)\n"
        "    try:\n        s.connect((host, port)); print('reached', host)\n"
        "    except OSError:\n        print('blocked', host)\n"
    )
    probe.write_text("name: probe\ncommand: [python3, -c, " + json.dumps(script) + "]\ntask_input: stdin\n")
    runner = BlackBoxRunner(load_profile(probe), sock)
    sb = await provider.create(runner.spec())
    try:
        result = await runner.run(sb, task="", api_key="k", model="m")
    finally:
        await sb.close()
    assert result.output is not None
    assert result.output.split("\n") == ["blocked 1.1.1.1", "blocked 127.0.0.1", "blocked 10.0.0.1"]


async def test_an_agent_that_never_exits_is_stopped_at_its_timeout(
    provider: SandboxProvider, server: tuple[CannedServer, Path], tmp_path: Path
) -> None:
    _, sock = server
    prof = tmp_path / "sleepy.yaml"
    prof.write_text("name: sleepy\ncommand: [sleep, '600']\ntimeout_s: 2\n")
    runner = BlackBoxRunner(load_profile(prof), sock)
    sb = await provider.create(runner.spec())
    try:
        result = await runner.run(sb, task="t", api_key="k", model="m")
    finally:
        await sb.close()
    assert result.timed_out and result.rc != 0
    assert result.duration_s < 10
    assert getattr(sb, "leaked", 0) == 0  # the provider found no process or file of it after close
