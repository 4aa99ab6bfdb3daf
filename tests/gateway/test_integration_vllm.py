"""Real vLLM behind, real clients in front: the proof that the gateway works (engine tests)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import uvicorn

from rollyard.core.engine_key import engine_headers
from rollyard.core.trajectory import Trajectory
from rollyard.engines.launcher import free_port
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app

pytestmark = pytest.mark.engine
ADMIN = "integration-admin"
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def gateway_url(
    vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    db = tmp_path_factory.mktemp("gw") / "journal.db"
    gw = build_gateway(
        {"vllm": VLLMBackend(vllm_url, name="vllm")}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny"
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(gw), port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    yield url
    server.should_exit = True
    t.join(10)


def program(url: str, **fields: object) -> dict:
    r = httpx.post(f"{url}/programs", json=fields, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return r.json()


def check_token_exact(url: str, pid: str, sdk_prompts: int) -> Trajectory:
    traj = Trajectory.model_validate(
        httpx.get(f"{url}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN}).json()
    )
    assert traj.num_turns == sdk_prompts
    for t in traj.turns:
        assert len(t.completion_ids) == len(t.completion_logprobs) > 0
        assert all(lp <= 1e-4 for lp in t.completion_logprobs)
    return traj


def test_openai_sync_chat_with_forced_tool_then_text_is_one_segment(gateway_url: str) -> None:
    p = program(gateway_url, sampling={"temperature": 1.0, "max_tokens": 160})
    api = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=p["api_key"], max_retries=0)
    msgs: list[dict] = [{"role": "user", "content": "list files"}]
    r1 = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, tool_choice="required")
    m1 = r1.choices[0].message
    assert m1.tool_calls and m1.tool_calls[0].function.name == "ls"
    msgs += [
        m1.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": m1.tool_calls[0].id, "content": "a"},
    ]
    stream = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, stream=True)
    assert any(c.choices and c.choices[0].finish_reason for c in stream)
    traj = check_token_exact(gateway_url, p["id"], 2)
    assert len(traj.segments) == 1
    assert "constrained_decoding" in traj.turns[0].flags


def test_openai_async_streaming_and_responses_api(gateway_url: str) -> None:
    p = program(gateway_url, sampling={"max_tokens": 160})

    async def run() -> None:
        api = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=p["api_key"], max_retries=0)
        s = await api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert [c async for c in s]
        r = await api.responses.create(
            model="tiny", input="go", tools=[{"type": "function", "name": "ls", "parameters": {}}],
            tool_choice="required",
        )  # fmt: skip
        call = next(o for o in r.output if o.type == "function_call")
        inp = [{"role": "user", "content": "go"}, call.model_dump(exclude_none=True)]
        inp.append({"type": "function_call_output", "call_id": call.call_id, "output": "x"})
        tools = [{"type": "function", "name": "ls", "parameters": {}}]
        events = [
            e async for e in await api.responses.create(model="tiny", input=inp, tools=tools, stream=True)
        ]
        assert events[0].type == "response.created"
        assert events[-1].type in ("response.completed", "response.incomplete")  # incomplete: max tokens

    asyncio.run(run())
    traj = check_token_exact(gateway_url, p["id"], 3)
    assert [len(s.turns) for s in traj.segments] == [1, 2]  # the responses call rewrote history


def _engine_metric(vllm_url: str, name: str) -> float:
    text = httpx.get(f"{vllm_url}/metrics", headers=engine_headers()).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert values, f"the engine's /metrics has no {name}"
    return sum(values)


def test_a_client_that_leaves_mid_stream_cancels_the_engine_request_and_frees_its_program(
    gateway_url: str, vllm_url: str
) -> None:
    """Real uvicorn (ASGI spec 2.3: the gateway's own disconnect watch): the client closes the
    stream after its first events; the engine stops generating long before the 1,500 tokens it
    was asked for, and the same program's next turn is served."""
    asked = 1500
    p = program(gateway_url, sampling={"max_tokens": asked, "ignore_eos": True})
    headers = {"Authorization": f"Bearer {p['api_key']}"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    before = _engine_metric(vllm_url, "vllm:generation_tokens_total")
    with httpx.stream("POST", f"{gateway_url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        texts = 0
        for line in r.iter_lines():  # until a few events that carry generated text
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                texts += bool(delta.get("content") or delta.get("reasoning_content"))
            if texts == 3:
                break
        assert texts == 3
    for _ in range(100):  # the engine's request is aborted once the gateway sees the disconnect
        if _engine_metric(vllm_url, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.1)
    assert _engine_metric(vllm_url, "vllm:num_requests_running") == 0
    time.sleep(0.5)
    generated = _engine_metric(vllm_url, "vllm:generation_tokens_total") - before
    assert 0 < generated < asked
    api = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=p["api_key"], max_retries=0)
    r2 = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "again"}], max_tokens=4, timeout=60
    )
    assert r2.choices[0].message is not None
    traj = Trajectory.model_validate(
        httpx.get(f"{gateway_url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
    )
    assert traj.turns[-1].completion_ids  # the journal is readable and holds the served turn


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_tool_use_conversation(gateway_url: str, stream: bool) -> None:
    p = program(gateway_url, sampling={"max_tokens": 160})
    api = anthropic.Anthropic(base_url=gateway_url, api_key=p["api_key"], max_retries=0)
    tools = [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}]
    msgs: list[dict] = [{"role": "user", "content": "list"}]
    r1 = api.messages.create(
        model="tiny", max_tokens=24, messages=msgs, tools=tools, tool_choice={"type": "any"}
    )
    use = next(b for b in r1.content if b.type == "tool_use")
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]})
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]}
    )
    if stream:
        with api.messages.stream(model="tiny", max_tokens=24, messages=msgs, tools=tools) as s:
            final = s.get_final_message()
    else:
        final = api.messages.create(model="tiny", max_tokens=24, messages=msgs, tools=tools)
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    traj = check_token_exact(gateway_url, p["id"], 2)
    assert len(traj.segments) == 1


def test_litellm_drives_the_gateway(gateway_url: str) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    p = program(gateway_url, sampling={"max_tokens": 12})
    r = litellm.completion(
        model="openai/tiny", api_base=f"{gateway_url}/v1", api_key=p["api_key"],
        messages=[{"role": "user", "content": "hello"}],
    )  # fmt: skip
    assert r.choices[0].finish_reason in ("stop", "length")
    check_token_exact(gateway_url, p["id"], 1)


@pytest.mark.slow
def test_kill_9_with_streams_in_flight_loses_no_acknowledged_turn_and_programs_continue(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "rollyard",
        "gateway",
        "--engine",
        vllm_url,
        "--model-dir",
        str(tiny_model_dir),
    ]
    cmd += ["--port", str(port), "--state-dir", str(tmp_path), "--model-name", "tiny"]
    env = {**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        for _ in range(200):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.1)
        proc.kill()
        raise AssertionError("gateway did not start")

    proc = start()
    progs = [program(url, sampling={"max_tokens": 8}) for _ in range(4)]
    acked: dict[str, int] = {p["id"]: 0 for p in progs}
    convs: dict[str, list[dict]] = {p["id"]: [{"role": "user", "content": "go"}] for p in progs}
    stop = threading.Event()

    def agent(p: dict, stream: bool) -> None:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key=p["api_key"], max_retries=0, timeout=30)
        while not stop.is_set():
            try:
                if stream:  # acknowledged when the stream's final chunk (finish_reason) arrives
                    text, done = "", False
                    for chunk in api.chat.completions.create(
                        model="tiny", messages=convs[p["id"]], stream=True
                    ):
                        for c in chunk.choices:
                            text += c.delta.content or ""
                            done = done or c.finish_reason is not None
                    if not done:
                        return
                    m: dict = {"role": "assistant", "content": text}
                else:
                    msg = (
                        api.chat.completions.create(model="tiny", messages=convs[p["id"]]).choices[0].message
                    )
                    m = msg.model_dump(exclude_none=True)
            except (openai.APIError, httpx.HTTPError):
                return
            acked[p["id"]] += 1
            convs[p["id"]] += [m, {"role": "user", "content": "more"}]

    # half the agents stream: a kill -9 lands on streams in flight too
    threads = [threading.Thread(target=agent, args=(p, i % 2 == 1)) for i, p in enumerate(progs)]
    for t in threads:
        t.start()
    time.sleep(6)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stop.set()
    for t in threads:
        t.join(30)
    assert sum(acked.values()) > 0
    proc = start()
    try:
        for p in progs:
            traj = Trajectory.model_validate(
                httpx.get(f"{url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
            )
            assert traj.num_turns >= acked[p["id"]]  # every acknowledged turn survived
        # an agent continues after the restart, in the same segment
        p = progs[0]
        api = openai.OpenAI(base_url=f"{url}/v1", api_key=p["api_key"], max_retries=0)
        msgs = convs[p["id"]]
        if (
            acked[p["id"]]
            == Trajectory.model_validate(
                httpx.get(f"{url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
            ).num_turns
        ):
            api.chat.completions.create(model="tiny", messages=msgs)
            traj = Trajectory.model_validate(
                httpx.get(f"{url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
            )
            assert len(traj.segments) == 1
        out = tmp_path / "x.parquet"
        export = ["export", "--journal", str(tmp_path / "journal.db"), "--out", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "rollyard", *export], capture_output=True, text=True, check=True
        )
        assert "wrote 4 trajectories" in done.stdout
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
