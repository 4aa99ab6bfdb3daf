"""Divided rollout on real vLLM: at temperature 0 a divided generation equals the undivided one,
token for token, through all three APIs, streaming and not (engine tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import uvicorn

from rollyard.core.trajectory import Trajectory
from rollyard.engines.launcher import free_port
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app

pytestmark = pytest.mark.engine
ADMIN = "divided-admin"
CHUNK, MAX_TOKENS = 32, 160
PROMPT = "Write a long story about the sea."


def serve(vllm_url: str, model_dir: Path, db: Path, divide: int | None) -> tuple[str, uvicorn.Server]:
    gw = build_gateway(
        {"vllm": VLLMBackend(vllm_url, name="vllm")},
        FastTokenizer(model_dir),
        db,
        ADMIN,
        "tiny",
        divide_tokens=divide,
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(gw), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    return f"http://127.0.0.1:{port}", server


@pytest.fixture(scope="module")
def gateways(
    vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    d = tmp_path_factory.mktemp("divided")
    whole, s1 = serve(vllm_url, tiny_model_dir, d / "whole.db", None)
    div, s2 = serve(vllm_url, tiny_model_dir, d / "div.db", CHUNK)
    yield whole, div
    s1.should_exit = s2.should_exit = True


def new_program(url: str) -> dict:
    body = {"sampling": {"temperature": 0.0, "max_tokens": MAX_TOKENS}}
    r = httpx.post(f"{url}/programs", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return r.json()


def turn_of(url: str, pid: str) -> tuple[Trajectory, list[int], list[float]]:
    t = Trajectory.model_validate(
        httpx.get(f"{url}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN}).json()
    )
    assert t.num_turns == 1
    return t, t.turns[0].completion_ids, t.turns[0].completion_logprobs


def chat(url: str, key: str, stream: bool) -> tuple[str, str | None, int]:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    msgs = [{"role": "user", "content": PROMPT}]
    if not stream:
        r = api.chat.completions.create(model="tiny", messages=msgs)
        return r.choices[0].message.content or "", r.choices[0].finish_reason, r.usage.completion_tokens
    text, finish, used = "", None, 0
    for c in api.chat.completions.create(
        model="tiny", messages=msgs, stream=True, stream_options={"include_usage": True}
    ):
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
        if c.usage:
            used = c.usage.completion_tokens
    return text, finish, used


def responses(url: str, key: str, stream: bool) -> tuple[str, str | None, int]:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    if not stream:
        r = api.responses.create(model="tiny", input=PROMPT)
        return r.output_text, r.status, r.usage.output_tokens if r.usage else 0
    text, final = "", None
    for e in api.responses.create(model="tiny", input=PROMPT, stream=True):
        if e.type == "response.output_text.delta":
            text += e.delta
        if e.type in ("response.completed", "response.incomplete"):
            final = e.response
    assert final is not None and final.output_text == text
    return text, final.status, final.usage.output_tokens if final.usage else 0


def messages(url: str, key: str, stream: bool) -> tuple[str, str | None, int]:
    api = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    msgs = [{"role": "user", "content": PROMPT}]
    if stream:
        with api.messages.stream(model="tiny", max_tokens=MAX_TOKENS, messages=msgs) as s:
            text = "".join(s.text_stream)
            m = s.get_final_message()
    else:
        m = api.messages.create(model="tiny", max_tokens=MAX_TOKENS, messages=msgs)
        text = "".join(b.text for b in m.content if b.type == "text")
    return text, m.stop_reason, m.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", [chat, responses, messages], ids=["chat", "responses", "messages"])
def test_divided_equals_undivided_at_temperature_zero(gateways: tuple[str, str], api, stream: bool) -> None:
    whole, div = gateways
    pw, pd = new_program(whole), new_program(div)
    answer_w = api(whole, pw["api_key"], stream)
    answer_d = api(div, pd["api_key"], stream)
    tw, ids_w, lps_w = turn_of(whole, pw["id"])
    td, ids_d, lps_d = turn_of(div, pd["id"])
    assert ids_d == ids_w  # token for token
    assert lps_d == pytest.approx(lps_w, abs=1e-3)
    assert answer_d == answer_w  # text, finish reason and usage of the whole generation
    assert answer_d[2] == len(ids_d)
    note = next(e.data["divided"] for e in td.events if "divided" in e.data)
    assert note["chunks"] == -(-len(ids_d) // CHUNK) >= 3
    assert sum(note["chunk_tokens"]) == len(ids_d)
    assert not any("divided" in e.data for e in tw.events)
