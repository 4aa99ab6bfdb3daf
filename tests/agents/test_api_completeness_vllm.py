"""What agent CLIs ask of the APIs, on the real engine through the official SDKs: forced tool
calls whose arguments validate against the tool's schema, ``top_logprobs`` alternatives only
when asked (the journal unchanged), and a program's ``max_tokens`` cap reported in each API's
own terms. The `rollyard gateway` process fronts the session's vLLM with a random tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import Trajectory
from rollyard.engines.vllm import VLLMBackend

from .conftest import ADMIN

pytestmark = pytest.mark.engine

BASH = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "a shell command"},
        "timeout": {"type": "integer", "minimum": 1, "maximum": 600},
    },
    "required": ["command"],
}
EDIT = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "mode": {"type": "string", "enum": ["append", "replace"]},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["path", "mode"],
}
SCHEMAS = {"bash": BASH, "edit_file": EDIT}
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
ANTHROPIC_TOOLS = [{"name": n, "description": n, "input_schema": s} for n, s in SCHEMAS.items()]
ASK = "Run ls, then edit notes.txt."


def program(url: str, **sampling: Any) -> dict[str, str]:
    body = {"group_id": "g-api", "task_id": "t-api", "sampling": {"temperature": 1.0, **sampling}}
    r = httpx.post(f"{url}/programs", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def trajectory(url: str, pid: str) -> Trajectory:
    r = httpx.get(f"{url}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN})
    return Trajectory.model_validate(r.json())


def oai(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)


def claude(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=300)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "edit_file"}}], ids=["required", "named"]
)
def test_openai_forced_tool_calls_validate_against_the_tools_schema(
    gateway: tuple[str, Path], choice: Any
) -> None:
    url, _ = gateway
    p = program(url, max_tokens=160)  # the smoke configs' budget: calls must end within it
    api = oai(url, p["api_key"])
    messages: list[Any] = [{"role": "user", "content": ASK}]
    for _ in range(3):
        r = api.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=OPENAI_TOOLS,
            tool_choice=choice,  # type: ignore[arg-type]
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls and len(c.message.tool_calls) == 1
        call = c.message.tool_calls[0]
        if isinstance(choice, dict):
            assert call.function.name == "edit_file"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        messages += [c.message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    traj = trajectory(url, p["id"])
    assert traj.num_turns == 3 and len(traj.segments) == 1
    assert all("constrained_decoding" in t.flags and "malformed_tool_call" not in t.flags for t in traj.turns)
    assert all(t.finish_reason.value == "stop" for t in traj.turns)  # ended by eos, not the cap


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "bash"}], ids=["any", "tool"])
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_forced_tool_use_validates_against_the_input_schema(
    gateway: tuple[str, Path], choice: Any, stream: bool
) -> None:
    url, _ = gateway
    p = program(url)
    api = claude(url, p["api_key"])
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": 160, "tools": ANTHROPIC_TOOLS, "tool_choice": choice}
    kw["messages"] = [{"role": "user", "content": ASK}]
    if stream:
        with api.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = api.messages.create(**kw)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0].name == "bash"
    jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_chat_top_logprobs_are_returned_when_asked_and_the_journal_is_unchanged(
    gateway: tuple[str, Path],
) -> None:
    url, _ = gateway
    p = program(url, max_tokens=12)
    api = oai(url, p["api_key"])
    msgs = [{"role": "user", "content": "hello"}]
    plain = api.chat.completions.create(model="tiny", messages=msgs, logprobs=True)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs and all(not e.top_logprobs for e in plain.choices[0].logprobs.content)
    p2 = program(url, max_tokens=12)
    r = oai(url, p2["api_key"]).chat.completions.create(
        model="tiny",
        messages=msgs,  # type: ignore[arg-type]
        logprobs=True,
        top_logprobs=3,
    )
    entries = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries and all(len(e.top_logprobs) == 3 for e in entries)
    for e in entries:
        alts = [a.logprob for a in e.top_logprobs]
        assert alts == sorted(alts, reverse=True) and e.logprob <= alts[0] + 1e-4
    turn = trajectory(url, p2["id"]).turns[0]
    assert [e.logprob for e in entries] == pytest.approx(turn.completion_logprobs, abs=1e-6)
    assert "top_logprobs" not in turn.model_dump_json()  # alternatives never reach the journal


async def test_the_engine_is_asked_for_alternatives_only_when_a_client_asks(vllm_url: str) -> None:
    backend = VLLMBackend(vllm_url)
    try:
        plain = await backend.completion_body([1, 2, 3], SamplingParams(max_tokens=4))
        asked = await backend.completion_body([1, 2, 3], SamplingParams(max_tokens=4, top_logprobs=2))
        c = await backend.generate([1, 2, 3], SamplingParams(max_tokens=4, top_logprobs=2))
    finally:
        await backend.aclose()
    # the ids come as the logprobs' tokens either way: no echo of the prompt's ids
    assert plain["logprobs"] == 0 and plain["return_tokens_as_token_ids"] is True
    assert "return_token_ids" not in plain and "return_token_ids" not in asked
    assert asked["logprobs"] == 2 and asked["return_tokens_as_token_ids"] is True
    assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
    assert all(len(row) == 2 and all(isinstance(t, int) for t, _ in row) for row in c.top_logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_include_output_text_logprobs_with_top_alternatives(
    gateway: tuple[str, Path], stream: bool
) -> None:
    url, _ = gateway
    p = program(url, max_tokens=12)
    api = oai(url, p["api_key"])
    kw: dict[str, Any] = {"model": "tiny", "input": "hello", "top_logprobs": 2}
    kw["include"] = ["message.output_text.logprobs"]
    if stream:
        events = list(api.responses.create(**kw, stream=True))
        done = [e for e in events if e.type == "response.output_text.done"]
        assert done and done[0].logprobs
        resp = events[-1].response  # type: ignore[union-attr]
    else:
        resp = api.responses.create(**kw)
    part = next(o for o in resp.output if o.type == "message").content[0]
    assert part.type == "output_text" and part.logprobs
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    turn = trajectory(url, p["id"]).turns[0]
    assert [lp.logprob for lp in part.logprobs] == pytest.approx(turn.completion_logprobs, abs=1e-6)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_cut_by_the_programs_max_tokens_says_so_in_each_apis_terms(
    gateway: tuple[str, Path], stream: bool
) -> None:
    url, _ = gateway
    p = program(url, max_tokens=3, ignore_eos=True)  # the program's cap, below what clients ask
    o, a = oai(url, p["api_key"]), claude(url, p["api_key"])
    msgs: Any = [{"role": "user", "content": "hello"}]
    if stream:
        chunks = list(o.chat.completions.create(model="tiny", messages=msgs, max_tokens=100, stream=True))
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        events = list(o.responses.create(model="tiny", input="hello", max_output_tokens=100, stream=True))
        assert events[-1].type == "response.incomplete"
        resp = events[-1].response  # type: ignore[union-attr]
        with a.messages.stream(model="tiny", max_tokens=100, messages=msgs) as s:
            msg = s.get_final_message()
    else:
        chat = o.chat.completions.create(model="tiny", messages=msgs, max_tokens=100)
        assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 3  # type: ignore[union-attr]
        resp = o.responses.create(model="tiny", input="hello", max_output_tokens=100)
        msg = a.messages.create(model="tiny", max_tokens=100, messages=msgs)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3
