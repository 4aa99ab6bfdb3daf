"""The chat format renders identically in Python and Jinja, concatenates per message, and parses back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rollyard.engines import chat_template as ct

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"), max_size=30)


@st.composite
def messages(draw: st.DrawFn) -> list[dict]:
    out: list[dict] = []
    if draw(st.booleans()):
        out.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(text)})
    for _ in range(draw(st.integers(1, 5))):
        role = draw(st.sampled_from(["user", "assistant", "tool"]))
        msg: dict = {"role": role, "content": draw(text)}
        if role == "assistant" and draw(st.booleans()):
            args = {"command": draw(text)}
            msg["tool_calls"] = [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": args}}
            ]
        out.append(msg)
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@settings(max_examples=60, deadline=None)
@given(msgs=messages(), with_tools=st.booleans())
def test_python_rendering_equals_the_jinja_template(tokenizer, msgs: list[dict], with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    assert tokenizer.apply_chat_template(
        msgs, tools=tools, tokenize=False, add_generation_prompt=True
    ) == ct.render_conversation(msgs, tools)


@settings(max_examples=60, deadline=None)
@given(msgs=messages())
def test_token_ids_of_a_conversation_are_the_concatenation_of_its_messages(
    tokenizer, msgs: list[dict]
) -> None:
    whole = tokenizer.encode(ct.render_conversation(msgs, TOOLS), add_special_tokens=False)
    full = msgs if msgs[0]["role"] in ("system", "developer") else [{"role": "system", "content": ""}, *msgs]
    parts: list[int] = []
    for i, m in enumerate(full):
        parts += tokenizer.encode(ct.render_message(m, TOOLS, first=i == 0), add_special_tokens=False)
    parts += tokenizer.encode(ct.render_generation_prompt(), add_special_tokens=False)
    assert whole == parts


@given(
    name=st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    args=st.dictionaries(st.text(max_size=5), text, max_size=3),
)
def test_a_formatted_tool_call_parses_back(name: str, args: dict) -> None:
    parsed = ct.parse_assistant("thinking aloud " + ct.format_tool_call(name, args) + ct.IM_END)
    assert not parsed.malformed
    assert parsed.content == "thinking aloud "
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(name, args)]


# Argument text that holds the template's own markers: code about tool calls, or a random model
# (which wrote a literal ``</tool_call>`` inside a forced call's string in 4 of 1,000 calls).
marked = st.lists(
    st.sampled_from([ct.TOOL_CALL_OPEN, ct.TOOL_CALL_CLOSE, ct.THINK_OPEN, ct.IM_END, "}", '"', "x"]),
    max_size=6,
).map("".join)


@given(
    calls=st.lists(
        st.tuples(
            st.from_regex(r"[a-z_]{1,10}", fullmatch=True), st.dictionaries(st.text(max_size=5), marked)
        ),
        min_size=1,
        max_size=3,
    ),
    between=st.sampled_from(["", "\n", " then "]),
)
def test_a_call_whose_arguments_hold_the_markers_parses_back(
    calls: list[tuple[str, dict]], between: str
) -> None:
    text = "plan: " + between.join(ct.format_tool_call(n, a) for n, a in calls)
    parsed = ct.parse_assistant(text + ct.IM_END)
    assert not parsed.malformed, parsed.errors
    assert parsed.content == "plan: " + between * (len(calls) - 1)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "x"',
        "text </tool_call>",
        "<tool_call>" + "[" * 100_000,  # nested past what json reads: once a RecursionError
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    ],
)
def test_malformed_tool_calls_are_flagged_and_kept_as_text(bad: str) -> None:
    parsed = ct.parse_assistant(bad)
    assert parsed.malformed
    assert parsed.tool_calls == []
    assert parsed.content == bad


def test_reasoning_is_split_from_content() -> None:
    parsed = ct.parse_assistant("<think>plan</think>answer")
    assert (parsed.reasoning, parsed.content) == ("plan", "answer")
    msg = {"role": "assistant", "content": "answer", "reasoning_content": "plan"}
    assert ct.render_message(msg) == "<|im_start|>assistant\n<think>plan</think>answer<|im_end|>"


def test_tool_call_arguments_as_json_string_render_canonically() -> None:
    a = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}],
    }
    b = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert ct.render_message(a) == ct.render_message(b)
    assert json.loads(ct.render_message(a).split("<tool_call>")[1].split("</tool_call>")[0])["arguments"] == {
        "a": 1
    }


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="role"):
        ct.render_message({"role": "wizard", "content": "x"})
