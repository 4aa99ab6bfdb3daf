"""Anthropic Messages and OpenAI Responses through their official SDKs (scripted engine)."""

from __future__ import annotations

import anthropic
import openai
from fastapi.testclient import TestClient

from rollyard.core.trajectory import Trajectory

from .conftest import ScriptedBackend, new_program, trajectory

CALL = '<tool_call>{"name": "ls", "arguments": {"dir": "src"}}</tool_call>'
A_TOOLS = [
    {"name": "ls", "description": "list", "input_schema": {"type": "object"}, "cache_control": {"x": 1}}
]
R_TOOLS = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}, {"type": "web_search"}]


def claude(client: TestClient, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key=key, http_client=client, max_retries=0)


def test_anthropic_tool_use_round_trip_extends_one_segment(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = claude(client, prog["api_key"])
    engine.script = ["Looking. " + CALL, "All done."]
    msgs: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "list src"}]}]
    system = [{"type": "text", "text": "you are terse", "cache_control": {"type": "ephemeral"}}]
    r1 = api.messages.create(
        model="claude-x", max_tokens=200, system=system, messages=msgs, tools=A_TOOLS,
        thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u"},
        extra_headers={"anthropic-beta": "context-1m"},
    )  # fmt: skip
    assert r1.stop_reason == "tool_use"
    use = next(b for b in r1.content if b.type == "tool_use")
    assert (use.name, use.input) == ("ls", {"dir": "src"})
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]})
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]}
    )
    r2 = api.messages.create(model="claude-x", max_tokens=200, system=system, messages=msgs, tools=A_TOOLS)
    assert r2.stop_reason == "end_turn" and r2.content[0].text == "All done."
    p1, c1, p2 = engine.prompts[0], engine.returned[0], engine.prompts[1]
    assert p2[: len(p1) + len(c1)] == p1 + c1
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert len(traj.segments) == 1
    ignored = next(e for e in traj.events if e.kind == "ignored_params").data
    assert "thinking" in ignored and "model" in ignored


def test_anthropic_stream_event_sequence_builds_the_same_message(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = claude(client, prog["api_key"])
    engine.script = ["Sure. " + CALL]
    msgs = [{"role": "user", "content": "go"}]
    with api.messages.stream(model="m", max_tokens=200, messages=msgs, tools=A_TOOLS) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert final.content[0].text == "Sure. "
    assert final.content[1].input == {"dir": "src"}
    assert final.usage.output_tokens == len(engine.returned[0])


def test_anthropic_count_tokens_matches_the_prompt_sent(client: TestClient, engine: ScriptedBackend) -> None:
    prog = new_program(client)
    api = claude(client, prog["api_key"])
    msgs = [{"role": "user", "content": "count me"}]
    n = api.messages.count_tokens(model="m", messages=msgs).input_tokens
    api.messages.create(model="m", max_tokens=8, messages=msgs)
    assert n == len(engine.prompts[0])


def test_responses_function_call_round_trip_and_stream(client: TestClient, engine: ScriptedBackend) -> None:
    prog = new_program(client)
    api = openai.OpenAI(
        base_url="http://testserver/v1", api_key=prog["api_key"], http_client=client, max_retries=0
    )
    engine.script = [CALL, "listed"]
    inp: list[dict] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "ls src"}]},
    ]
    r1 = api.responses.create(
        model="tiny", input=inp, tools=R_TOOLS, reasoning={"effort": "low"}, store=False,
        include=["reasoning.encrypted_content"], prompt_cache_key="k", parallel_tool_calls=True,
    )  # fmt: skip
    call = next(o for o in r1.output if o.type == "function_call")
    assert call.name == "ls" and call.arguments == '{"dir": "src"}'
    inp += [o.model_dump(exclude_none=True) for o in r1.output]
    inp.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.py"})
    with api.responses.stream(model="tiny", input=inp, tools=R_TOOLS) as s:
        events = [e.type for e in s]
        final = s.get_final_response()
    assert final.output_text == "listed"
    assert events[0] == "response.created" and events[-1] == "response.completed"
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert len(traj.segments) == 1 and traj.num_turns == 2


def test_responses_previous_response_id_continues_the_conversation(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = openai.OpenAI(
        base_url="http://testserver/v1", api_key=prog["api_key"], http_client=client, max_retries=0
    )
    r1 = api.responses.create(model="tiny", input="hello")
    api.responses.create(model="tiny", input="and then?", previous_response_id=r1.id)
    p1, c1, p2 = engine.prompts[0], engine.returned[0], engine.prompts[1]
    assert p2[: len(p1) + len(c1)] == p1 + c1


def test_the_base_urls_a_new_program_gets_work_as_given_in_each_sdk(client: TestClient) -> None:
    """``POST /programs`` answers each API's base URL: pasted as-is into the OpenAI and the
    Anthropic SDK (which add different suffixes), both reach the program's model."""
    prog = new_program(client)
    urls = prog["base_urls"]
    assert urls == {"openai": "http://testserver/v1", "anthropic": "http://testserver"}
    key = str(prog["api_key"])
    oa = openai.OpenAI(base_url=urls["openai"], api_key=key, http_client=client, max_retries=0)
    chat = oa.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].message is not None
    an = anthropic.Anthropic(base_url=urls["anthropic"], api_key=key, http_client=client, max_retries=0)
    msg = an.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert msg.content is not None and msg.usage.output_tokens > 0
    assert trajectory(client, str(prog["id"]))["segments"]  # both calls were the program's


def test_responses_honours_the_logprobs_include_and_records_the_other_entries_as_ignored(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = openai.OpenAI(base_url="http://testserver/v1", api_key=prog["api_key"], http_client=client)
    include = ["message.output_text.logprobs", "reasoning.encrypted_content"]
    r = api.responses.create(model="tiny", input="hello", include=include, top_logprobs=2)  # type: ignore[arg-type]
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.logprobs and engine.params[0].top_logprobs == 2
    api.responses.create(model="tiny", input="hello", top_logprobs=2)
    assert engine.params[1].top_logprobs == 0  # not asked of the engine without the include
    ignored = [
        e.data
        for e in Trajectory.model_validate(trajectory(client, prog["id"])).events
        if e.kind == "ignored_params"
    ]
    assert ignored[0] == {"include": ["reasoning.encrypted_content"]}
    assert ignored[1] == {"top_logprobs": 2}
