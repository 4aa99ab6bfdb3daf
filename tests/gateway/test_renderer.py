"""Renderer: fresh renders equal the chat template; extensions reuse ids; property tests."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core.errors import ContextLengthExceeded
from rollyard.core.prompt_ids import PromptIds, ids_json_parts
from rollyard.engines import chat_template as ct
from rollyard.gateway.renderer import ConversationState, Renderer, tools_key
from rollyard.gateway.types import ChatRequest, Message, Tool, ToolCall

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
CALLS = st.lists(
    st.builds(
        ToolCall, st.sampled_from(["ls", "cat"]), st.dictionaries(st.sampled_from("abc"), TEXT, max_size=2)
    ),
    max_size=2,
)
MESSAGE = st.one_of(
    st.builds(Message, st.sampled_from(["system", "user", "tool"]), TEXT),
    st.builds(lambda c, calls: Message("assistant", c, tuple(calls)), TEXT, CALLS),
)
TOOLS = st.lists(st.builds(Tool, st.sampled_from(["ls", "cat"]), TEXT), max_size=2)


@given(msgs=st.lists(MESSAGE, min_size=1, max_size=5), tools=TOOLS)
def test_fresh_render_equals_tokenizing_the_whole_template(
    tok, msgs: list[Message], tools: list[Tool]
) -> None:
    r = Renderer(tok)
    req = ChatRequest(messages=msgs, tools=tools)
    text = ct.render_conversation([m.to_template() for m in msgs], [t.to_template() for t in tools] or None)
    assert r.render_fresh(req) == tok.encode(text)


@given(history=st.lists(MESSAGE, min_size=1, max_size=4), new=st.lists(MESSAGE, min_size=1, max_size=3))
def test_an_extension_keeps_the_previous_ids_verbatim(
    tok, history: list[Message], new: list[Message]
) -> None:
    r = Renderer(tok)
    prompt = r.render_fresh(ChatRequest(messages=history))
    completion = [5, 6, 7, tok.eos_id]  # arbitrary ids: reuse must not re-tokenize them
    returned = Message("assistant", "hello", (ToolCall("ls", {"a": "1"}, "id1"),))
    state = ConversationState(history, tools_key([]), returned, prompt, completion)
    echoed = Message("assistant", " hello ", (ToolCall("ls", '{"a":  "1"}', "other"),))
    plan = r.render(ChatRequest(messages=[*history, echoed, *new]), state)
    assert plan.extends and plan.prompt_ids[: len(prompt) + 4] == prompt + completion
    assert plan.reused_tokens == len(prompt) + 4


def test_changed_tools_or_edited_answer_is_a_rewrite(tok) -> None:
    r = Renderer(tok)
    hist = [Message("user", "q")]
    returned = Message("assistant", "a")
    state = ConversationState(
        hist, tools_key([]), returned, r.render_fresh(ChatRequest(hist)), [9, tok.eos_id]
    )
    more = [Message("user", "more")]
    tools_changed = r.render(ChatRequest([*hist, returned, *more], tools=[Tool("ls")]), state)
    edited = r.render(ChatRequest([*hist, Message("assistant", "b"), *more]), state)
    same = r.render(ChatRequest([*hist, returned, *more]), state)
    assert tools_changed.rewrite_reason == "tools_changed" and not tools_changed.extends
    assert edited.rewrite_reason == "assistant_message_edited"
    assert same.extends


def test_conversation_state_survives_json(tok) -> None:
    m = Message("assistant", "x", (ToolCall("ls", {"a": 1}, "c"),), "think")
    s = ConversationState([Message("user", "q")], "[]", m, [1, 2], [3], 4, 1, "resp_x")
    body = s.to_json()
    assert "prompt_ids" not in body  # the journal's turn row holds them
    assert ConversationState.from_json(body, [1, 2], [3]) == s
    # a journal written before the ids moved out: its own copy is used
    assert ConversationState.from_json({**body, "prompt_ids": [1, 2], "completion_ids": [3]}, [], []) == s


def test_dropped_reasoning_extends_with_the_reasoning_ids_but_changed_reasoning_is_a_rewrite(tok) -> None:
    r = Renderer(tok)
    hist = [Message("user", "q")]
    completion = [*tok.encode("<think>plan</think>a"), tok.eos_id]
    returned = Message("assistant", "a", (), "plan")
    state = ConversationState(hist, tools_key([]), returned, r.render_fresh(ChatRequest(hist)), completion)
    more = [Message("user", "more")]
    dropped = r.render(ChatRequest([*hist, Message("assistant", "a"), *more]), state)
    kept = r.render(ChatRequest([*hist, returned, *more]), state)
    changed = r.render(ChatRequest([*hist, Message("assistant", "a", (), "other plan"), *more]), state)
    head = state.prompt_ids + completion
    assert dropped.extends and dropped.prompt_ids[: len(head)] == head  # the engine still sees "plan"
    assert kept.extends and kept.prompt_ids == dropped.prompt_ids
    assert not changed.extends and changed.rewrite_reason == "assistant_message_edited"


def test_a_history_without_the_returned_reply_is_a_rewrite_that_says_so(tok) -> None:
    """mini-SWE-agent answers an unparseable reply with a format-error message and leaves the
    reply itself out of the next request: the gateway starts a new segment and names why."""
    r = Renderer(tok)
    hist = [Message("system", "sys"), Message("user", "task")]
    returned = Message("assistant", "garbage")
    state = ConversationState(
        hist, tools_key([]), returned, r.render_fresh(ChatRequest(hist)), [9, tok.eos_id]
    )
    dropped = r.render(ChatRequest([*hist, Message("user", "format error: call a tool")]), state)
    assert not dropped.extends and dropped.rewrite_reason == "assistant_message_dropped"
    assert r.render(ChatRequest([*hist, returned]), state).rewrite_reason == "no_new_messages"


def test_a_message_keeps_its_canonical_form_without_changing_what_it_equals() -> None:
    def call() -> Message:
        return Message("assistant", " hi ", (ToolCall("bash", {"b": 1, "a": [2]}, "call_1"),))

    m = call()
    first = m.canonical()
    assert m.canonical() is first
    assert first == call().canonical() == ("assistant", "hi", (("bash", '{"a":[2],"b":1}'),))
    assert m == call() and repr(m) == repr(call())
    assert tools_key([]) == "[]"


@given(history=st.lists(MESSAGE, min_size=1, max_size=4), edit=st.integers(0, 3), new=MESSAGE)
def test_a_history_compared_without_canonical_forms_is_judged_as_with_them(
    tok, history: list[Message], edit: int, new: Message
) -> None:
    """The shortcut for messages sent back unchanged gives the verdict the canonical forms give."""
    r = Renderer(tok)
    returned = Message("assistant", "a")
    state = ConversationState(history, tools_key([]), returned, r.render_fresh(ChatRequest(history)), [9])
    sent = list(history)
    sent[edit % len(sent)] = new
    by_canonical = next(
        (
            f"history_edited_at_{i}"
            for i, (a, b) in enumerate(zip(sent, history, strict=True))
            if a.canonical() != b.canonical()
        ),
        None,
    )
    plan = r.render(ChatRequest([*sent, returned, Message("user", "go")]), state)
    assert plan.rewrite_reason == by_canonical
    assert plan.extends == (by_canonical is None)


async def test_an_extension_renders_only_its_new_messages_on_the_loop(tok) -> None:
    """A long history is not rendered again, so it does not send the turn to a worker thread
    (or tokenize it): only the new messages' size counts; a rewrite is rendered whole, off it."""
    seen: list[tuple[str, bool]] = []

    class Watched:
        eos_id = tok.eos_id

        def encode(self, text: str) -> list[int]:
            seen.append((text, threading.current_thread() is threading.main_thread()))
            return tok.encode(text)

        def decode(self, ids: list[int]) -> str:
            return tok.decode(ids)

    r = Renderer(Watched(), offload_chars=1000)
    history = [Message("user", "x " * 2000)]
    returned = Message("assistant", "ok")
    state = ConversationState(history, "[]", returned, r.render_fresh(ChatRequest(history)), [9, tok.eos_id])
    seen.clear()
    plan = await r.arender(ChatRequest([*history, returned, Message("user", "next")]), state)
    assert plan.extends and [on_loop for _, on_loop in seen] == [True]
    assert "next" in seen[0][0] and "x x" not in seen[0][0]
    assert isinstance(plan.prompt_ids, PromptIds) and plan.prompt_ids.checked == len(state.prompt_ids) + 2
    seen.clear()
    rewrite = await r.arender(
        ChatRequest([Message("user", "y " * 2000), returned, Message("user", "n")]), state
    )
    assert not rewrite.extends and seen and not any(on_loop for _, on_loop in seen)


async def test_an_extension_is_checked_for_fit_by_its_new_text_against_what_is_left(tok) -> None:
    """An extension's earlier messages are not summed again each turn (an agent's hundreds of
    them): its new text is checked against the limit less the ids the conversation already has.
    A request that does not extend the state is checked whole, as a first turn is."""
    r = Renderer(tok)
    longest = tok.max_token_chars
    limit = 100
    history = [Message("user", "x" * (3 * limit * longest))]  # too long to fit, were it counted
    returned = Message("assistant", "ok")
    state = ConversationState(history, "[]", returned, [1] * 40, [9, tok.eos_id])  # 42 ids known

    fits = Message("user", "y" * (limit - 42) * longest)
    plan = await r.arender(ChatRequest([*history, returned, fits]), state, limit)
    assert plan.extends

    over = Message("user", "y" * ((limit - 42) * longest + 1))
    with pytest.raises(ContextLengthExceeded, match="the 58 tokens left after the conversation's 42"):
        await r.arender(ChatRequest([*history, returned, over]), state, limit)
    with pytest.raises(ContextLengthExceeded, match=f"more than {limit} tokens can hold"):
        await r.arender(ChatRequest([*history, Message("assistant", "edited"), fits]), state, limit)
    await r.arender(ChatRequest([*history, returned, over]), state)  # no limit: not checked


async def test_a_turn_extends_its_conversations_own_list_and_a_failed_one_is_cut_back(tok) -> None:
    """The program's turn appends to the state's id list (no copy of the history); until a
    turn is recorded the state's prompt is still its first ``prompt_len`` ids, a render for
    ``count_tokens`` copies, and the turn after a failed one (its ids posted, then dropped)
    renders exactly what a render of a copy gives."""
    r = Renderer(tok)
    history = [Message("user", "what is in the repo?")]
    returned = Message("assistant", "let me look")
    recorded = r.render_fresh(ChatRequest(history))
    completion = [7, 8, 9]  # no eos: closed with one by the next prompt
    state = ConversationState(history, "[]", returned, recorded, completion)
    prompt = list(recorded)

    failed = await r.arender(
        ChatRequest([*history, returned, Message("user", "failed")]),
        state,
        in_place=True,
    )
    assert failed.prompt_ids is state.prompt_ids and len(state.prompt_ids) > len(prompt)
    assert state.prompt() == prompt and state.known_tokens == len(prompt) + 3
    ids_json_parts(failed.prompt_ids)  # posted to the engine, then the turn failed

    nxt = ChatRequest([*history, returned, Message("user", "the next turn's output " * 20)])
    grown = len(state.prompt_ids)
    counted = await r.arender(nxt, state)
    assert counted.prompt_ids is not state.prompt_ids and len(state.prompt_ids) == grown

    expected = r.render(nxt, ConversationState(history, "[]", returned, PromptIds(prompt), completion))
    plan = await r.arender(nxt, state, in_place=True)
    assert plan.prompt_ids is state.prompt_ids
    assert list(plan.prompt_ids) == list(expected.prompt_ids) == list(counted.prompt_ids)
    assert plan.reused_tokens == expected.reused_tokens == len(prompt) + 4  # and the eos
    assert plan.prompt_ids.checked == len(prompt) + 3
    assert (
        b"".join(ids_json_parts(plan.prompt_ids))
        == json.dumps(list(plan.prompt_ids)).replace(" ", "").encode()
    )
