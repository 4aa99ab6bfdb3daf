"""Streamed events read as they arrive: payloads whatever the splits, deltas merged in order."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core import EngineError
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import CompletionDelta
from rollyard.engines.stream_read import SSEPayloads, StreamCount, event_deltas, merge_deltas

BODY = 'data: {"a": "é"}\n\n: a comment\ndata: {"b": 2}\n\ndata: [DONE]\n\n'.encode()


@given(st.lists(st.integers(0, len(BODY)), max_size=8))
def test_payloads_are_the_same_however_the_body_is_split(cuts: list[int]) -> None:
    points = sorted({0, len(BODY), *cuts})
    events, got = SSEPayloads(), []
    for a, b in itertools.pairwise(points):
        got += events.feed(BODY[a:b])
    got += events.feed(b"")
    assert got == ['{"a": "é"}'.encode(), b'{"b": 2}', b"[DONE]"]


def test_a_last_line_without_its_newline_is_read_at_the_end() -> None:
    events = SSEPayloads()
    assert events.feed(b"data: 1\ndata: 2") == [b"1"]
    assert events.feed(b"") == [b"2"]


def test_merged_deltas_carry_every_token_in_order_and_the_last_finish_reason() -> None:
    a = CompletionDelta(token_ids=[1, 2], logprobs=[-0.1, -0.2], prompt_tokens=5, policy_version=3)
    b = CompletionDelta(token_ids=[], logprobs=[], prompt_tokens=5, policy_version=3)
    c = CompletionDelta(
        token_ids=[3], logprobs=[-0.3], finish_reason=FinishReason.LENGTH, prompt_tokens=5, policy_version=3
    )
    m = merge_deltas([a, b, c])
    assert (m.token_ids, m.logprobs, m.finish_reason) == ([1, 2, 3], [-0.1, -0.2, -0.3], FinishReason.LENGTH)
    assert (m.prompt_tokens, m.policy_version, m.top_logprobs) == (5, 3, None)
    assert merge_deltas([a]) is a


def test_alternatives_stay_at_their_positions_when_some_deltas_have_none() -> None:
    a = CompletionDelta(token_ids=[1], logprobs=[-0.1], top_logprobs=[[(1, -0.1), (7, -2.0)]])
    b = CompletionDelta(token_ids=[2, 3], logprobs=[-0.2, -0.3])
    m = merge_deltas([a, b])
    assert m.top_logprobs == [[(1, -0.1), (7, -2.0)], [], []]


def test_an_event_reads_as_the_validated_delta_of_its_choice() -> None:
    payload = (
        b'{"choices":[{"index":0,"text":"hi","token_ids":[5,6],'
        b'"logprobs":{"token_logprobs":[-0.5,-Infinity]},"finish_reason":"length"}]}'
    )
    (got,) = event_deltas(payload, prompt_tokens=9, version=2)
    want = CompletionDelta(
        token_ids=[5, 6],
        logprobs=[-0.5, -1e4],
        finish_reason=FinishReason.LENGTH,
        prompt_tokens=9,
        policy_version=2,
    )
    assert got == want
    assert (
        event_deltas(b'{"choices":[{"index":0,"text":"","token_ids":[],"finish_reason":null}]}', 9, 2) == []
    )


def _event(ids: list[int], reason: str | None = None) -> bytes:
    lp = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)}
    choice = {"index": 0, "text": "x", "logprobs": lp, "finish_reason": reason}
    return json.dumps({"choices": [choice]}).encode()


def test_a_streamed_event_without_logprobs_is_the_engines_error() -> None:
    with pytest.raises(EngineError):
        event_deltas(b'{"choices":[{"index":0,"text":"hello","logprobs":null,"finish_reason":null}]}', 9, 2)


def test_the_streams_ids_are_checked_against_its_final_usage_event() -> None:
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}).encode()
    agree = StreamCount()
    for payload in (_event([5, 6]), _event([7], "stop"), usage):
        event_deltas(payload, 9, 2, count=agree)
    agree.check()
    short = StreamCount()
    for payload in (_event([5, 6], "stop"), usage):
        event_deltas(payload, 9, 2, count=short)
    with pytest.raises(EngineError, match="counted 3 completion tokens but sent 2"):
        short.check()
    unreported = StreamCount()  # an engine that sends no usage: nothing to compare against
    event_deltas(_event([5]), 9, 2, count=unreported)
    unreported.check()


_LOGPROB = st.one_of(st.floats(-50, 0), st.just(None), st.just(float("-inf")))


@st.composite
def _events(draw: st.DrawFn) -> bytes:
    """A streamed event as vLLM may write it: ids as ``token_ids`` or as logprobs' tokens, a
    null or ``-Infinity`` logprob, alternatives, a finish reason, a usage, fields it adds."""
    ids = draw(st.lists(st.integers(0, 10**6), max_size=4))
    lps = draw(st.lists(_LOGPROB, min_size=len(ids), max_size=len(ids)))
    rows = [{f"token_id:{t}": -1.0, "token_id:3": -2.5} for t in ids]
    logprobs = {"text_offset": list(range(len(ids))), "token_logprobs": lps, "top_logprobs": rows}
    choice: dict[str, object] = {"index": 0, "text": "x", "stop_reason": None}
    choice["finish_reason"] = draw(st.sampled_from([None, "stop", "length", "abort"]))
    if draw(st.booleans()):
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = [1, 2, 3]
    else:
        logprobs["tokens"] = [f"token_id:{t}" for t in ids]
    choice["logprobs"] = logprobs
    event: dict[str, object] = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
    if draw(st.booleans()):
        event["usage"] = {"prompt_tokens": 3, "completion_tokens": len(ids)}
    text = json.dumps(event)  # -Infinity as vLLM writes it (Python's json does the same)
    return text.encode()


@given(_events(), st.sampled_from([0, 1, 2]))
def test_the_typed_reader_reads_what_the_general_one_reads(payload: bytes, top: int) -> None:
    from rollyard.engines.stream_read import _event_deltas

    typed, general = StreamCount(), StreamCount()
    assert event_deltas(payload, 9, 2, top, typed) == _event_deltas(payload, 9, 2, top, general)
    assert (typed.ids, typed.usage) == (general.ids, general.usage)


def test_a_typed_event_of_another_shape_is_read_by_the_general_reader() -> None:
    odd = b'{"choices":[{"index":0,"token_ids":[5],"logprobs":{"token_logprobs":["-0.5"]}}]}'
    (got,) = event_deltas(odd, 9, 2)  # a logprob as a string: the dicts' reader takes it
    assert got.token_ids == [5] and got.logprobs == [-0.5]


def test_an_event_as_vllm_streams_it_is_read_by_the_typed_reader() -> None:
    from rollyard.engines.stream_read import _decode_event

    event = _decode_event(_event([5, 6], "stop"))  # raises if the types no longer take it
    assert event.choices is not None and event.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("token", ["token_id:", "token_id:1a", "tok:5", "token_id:٣", "token_id: 5"])
def test_a_one_token_event_whose_token_is_no_id_is_the_engines_error(token: str) -> None:
    from rollyard.engines.stream_read import _event_deltas

    lp = {"tokens": [token], "token_logprobs": [-0.5]}
    payload = json.dumps({"choices": [{"index": 0, "logprobs": lp, "finish_reason": None}]}).encode()
    for read in (event_deltas, _event_deltas):
        with pytest.raises(EngineError, match="not token ids"):
            read(payload, 9, 2, 0, StreamCount())


def test_a_one_token_event_with_an_overflowing_logprob_reads_as_the_general_reader_reads_it() -> None:
    from rollyard.engines.stream_read import _event_deltas

    lp = '{"tokens": ["token_id:5"], "token_logprobs": [-1e999]}'
    payload = ('{"choices": [{"index": 0, "logprobs": ' + lp + ', "finish_reason": "stop"}]}').encode()
    assert event_deltas(payload, 9, 2) == _event_deltas(payload, 9, 2, 0, None)
