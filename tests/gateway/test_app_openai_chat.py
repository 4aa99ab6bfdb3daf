"""The OpenAI chat route through the official SDK, against a scripted engine (unit level)."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient

from rollyard.core.trajectory import Trajectory

from .conftest import ScriptedBackend, new_program, trajectory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'


def sdk(client: TestClient, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)


def test_multi_turn_tool_conversation_reuses_ids_and_records_one_segment(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = ["Let me look. " + CALL, "Done."]
    msgs: list[dict] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix a.py"}]
    r1 = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    m1 = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls"
    assert m1.tool_calls[0].function.name == "read_file"
    assert json.loads(m1.tool_calls[0].function.arguments) == {"path": "a.py"}
    assert m1.content == "Let me look. "
    msgs.append(m1.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": m1.tool_calls[0].id, "content": "print(1)"})
    r2 = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    assert r2.choices[0].message.content == "Done."
    # the second prompt starts with the first prompt + the engine's own completion ids, verbatim
    p1, c1, p2 = engine.prompts[0], engine.returned[0], engine.prompts[1]
    assert p2[: len(p1) + len(c1)] == p1 + c1
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert len(traj.segments) == 1 and traj.num_turns == 2
    assert traj.turns[1].prompt_ids == p2
    assert traj.turns[0].completion_ids == c1
    assert traj.turns[0].policy_version == 3
    assert r2.usage.prompt_tokens == len(p2)


def test_echoed_assistant_with_other_ids_and_whitespace_still_extends(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = [CALL, "fine"]
    msgs: list[dict] = [{"role": "user", "content": "go"}]
    m1 = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS).choices[0].message
    echoed = {
        "role": "assistant",
        "content": "",  # SDKs send "" or None
        "tool_calls": [
            {
                "id": "other-id",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{ "path":"a.py" }'},
            }
        ],
    }
    assert m1.content is None
    msgs += [echoed, {"role": "tool", "tool_call_id": "other-id", "content": "x"}]
    api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert len(traj.segments) == 1
    assert not [e for e in traj.events if e.kind == "context_rewrite"]


def test_history_rewrite_starts_a_new_segment_with_an_event(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = ["first answer", "second"]
    msgs: list[dict] = [{"role": "user", "content": "a long question"}]
    m1 = api.chat.completions.create(model="tiny", messages=msgs).choices[0].message
    edited = [{"role": "user", "content": "summary"}, {"role": "assistant", "content": m1.content + "!"}]
    api.chat.completions.create(model="tiny", messages=[*edited, {"role": "user", "content": "next"}])
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert [len(s.turns) for s in traj.segments] == [1, 1]
    rewrites = [e for e in traj.events if e.kind == "context_rewrite"]
    assert len(rewrites) == 1 and rewrites[0].turn_index == 1
    assert rewrites[0].data["reason"].startswith("history_edited")


def test_streaming_equals_non_streaming_and_carries_tool_call_deltas(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = ["Hi <b> there " + CALL]
    stream = api.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == "Hi <b> there "
    assert [c.function.name for c in calls] == ["read_file"]
    assert finish == ["tool_calls"]
    usage = chunks[-1].usage
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert usage.completion_tokens == len(traj.turns[0].completion_ids) == len(engine.returned[0])
    assert traj.turns[0].completion_ids == engine.returned[0]


def test_trainer_sampling_policy_wins_and_both_are_recorded(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client, sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 5})
    api = sdk(client, prog["api_key"])
    engine.script = ["a much longer answer than five tokens"]
    r = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], temperature=0.0, top_p=0.5, max_tokens=50
    )
    assert r.choices[0].finish_reason == "length"
    applied = engine.params[0]
    assert (applied.temperature, applied.top_p, applied.max_tokens) == (0.7, 0.9, 5)
    turn = Trajectory.model_validate(trajectory(client, prog["id"])).turns[0]
    assert turn.requested_sampling == {"temperature": 0.0, "top_p": 0.5, "max_tokens": 50}
    assert turn.sampling["temperature"] == 0.7


def test_continuing_after_a_length_cut_closes_the_message_with_eos(
    client: TestClient, engine: ScriptedBackend, tok
) -> None:
    prog = new_program(client, sampling={"max_tokens": 4})
    api = sdk(client, prog["api_key"])
    engine.script = ["truncated answer", "x"]
    msgs: list[dict] = [{"role": "user", "content": "q"}]
    m1 = api.chat.completions.create(model="tiny", messages=msgs).choices[0].message
    msgs += [{"role": "assistant", "content": m1.content}, {"role": "user", "content": "go on"}]
    api.chat.completions.create(model="tiny", messages=msgs)
    p1, c1, p2 = engine.prompts[0], engine.returned[0], engine.prompts[1]
    assert c1[-1] != tok.eos_id
    assert p2[: len(p1) + len(c1) + 1] == [*p1, *c1, tok.eos_id]
    traj = Trajectory.model_validate(trajectory(client, prog["id"]))
    assert len(traj.segments) == 1
    assert "eos_appended_to_previous" in traj.turns[1].flags


def test_malformed_tool_call_is_returned_as_text_and_flagged(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = ['<tool_call>{"name": broken</tool_call>']
    r = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    assert r.choices[0].message.tool_calls is None
    assert "broken" in r.choices[0].message.content
    turn = Trajectory.model_validate(trajectory(client, prog["id"])).turns[0]
    assert "malformed_tool_call" in turn.flags


def test_a_named_tool_choice_sends_a_grammar_for_that_tool_only(
    client: TestClient, engine: ScriptedBackend
) -> None:
    prog = new_program(client)
    api = sdk(client, prog["api_key"])
    engine.script = [CALL]
    api.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        tools=[*TOOLS, {"type": "function", "function": {"name": "write_file", "parameters": {}}}],
        tool_choice={"type": "function", "function": {"name": "read_file"}},
    )
    grammar = engine.params[0].grammar
    assert grammar is not None and "read_file" in grammar and "write_file" not in grammar
    assert "constrained_decoding" in Trajectory.model_validate(trajectory(client, prog["id"])).turns[0].flags


def test_base_url_without_v1_and_program_url_form_work(client: TestClient, engine: ScriptedBackend) -> None:
    prog = new_program(client)
    for base in ("http://testserver", f"http://testserver/p/{prog['id']}/v1"):
        api = openai.OpenAI(base_url=base, api_key=prog["api_key"], http_client=client, max_retries=0)
        r = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "ok"


@pytest.mark.parametrize("stream", [False, True])
def test_another_programs_key_cannot_use_a_program_url(client: TestClient, stream: bool) -> None:
    a, b = new_program(client), new_program(client)
    api = openai.OpenAI(
        base_url=f"http://testserver/p/{a['id']}/v1", api_key=b["api_key"], http_client=client
    )
    with pytest.raises(openai.PermissionDeniedError):
        api.with_options(max_retries=0).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], stream=stream
        )


def test_answer_says_how_long_the_engine_took_in_server_timing(client: TestClient) -> None:
    key = new_program(client)["api_key"]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200
    timing = r.headers["server-timing"]
    parts = dict(p.strip().split(";dur=") for p in timing.split(","))
    assert set(parts) == {"engine", "gateway"} and all(float(v) >= 0 for v in parts.values())


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_the_recorded_ones_when_asked(client: TestClient, stream: bool) -> None:
    """``logprobs: true`` returns one entry per completion token: the journal's own logprob of
    the sampled token and the token's text (so a client can sum exactly what training sees,
    end-of-turn token included); not asked, ``logprobs`` stays null."""
    prog = new_program(client)
    oa = sdk(client, str(prog["api_key"]))
    msgs = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = list(oa.chat.completions.create(model="tiny", messages=msgs, logprobs=True, stream=True))
        got = [
            c for ch in chunks for choice in ch.choices if choice.logprobs for c in choice.logprobs.content
        ]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    else:
        r = oa.chat.completions.create(model="tiny", messages=msgs, logprobs=True)
        got, text = r.choices[0].logprobs.content, r.choices[0].message.content or ""
    turn = Trajectory.model_validate(trajectory(client, str(prog["id"]))).turns[-1]
    assert [c.logprob for c in got] == pytest.approx(turn.completion_logprobs)
    assert len(got) == len(turn.completion_ids) > 0
    joined = "".join(c.token for c in got)  # every recorded token, the end-of-turn one included
    assert joined.startswith(text) and joined[len(text) :] in ("", "<|im_end|>")
    plain = oa.chat.completions.create(model="tiny", messages=msgs)
    assert plain.choices[0].logprobs is None
