"""Reading a vLLM choice's logprobs: the one-pass path for all-finite answers gives what the
per-token rule gives for any answer (nulls, infinities, NaN, huge values)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core import EngineError
from rollyard.engines.vllm_choice import check_count, loads, token_ids, token_logprobs

values = st.one_of(
    st.none(), st.floats(), st.integers(-(10**6), 0), st.sampled_from([-math.inf, math.nan, 1e308])
)


def per_token(raw: list[object]) -> list[float]:
    """The rule, one entry at a time: null is 0, anything not finite is -1e4."""
    out = []
    for x in raw:
        v = float(x) if x is not None else 0.0  # type: ignore[arg-type]
        out.append(v if math.isfinite(v) else -1e4)
    return out


@given(raw=st.lists(values, max_size=40))
def test_logprobs_read_in_one_pass_equal_the_per_token_rule(raw: list[object]) -> None:
    got = token_logprobs({"logprobs": {"token_logprobs": raw}}, len(raw))
    assert got == per_token(raw)
    assert all(math.isfinite(v) for v in got)


def test_a_count_that_differs_from_the_ids_is_the_engines_error() -> None:
    with pytest.raises(EngineError, match="3 token ids but 2 logprobs"):
        token_logprobs({"logprobs": {"token_logprobs": [-1.0, -2.0]}}, 3)


TRICKY = st.sampled_from(['"prompt_token_ids":[1]', "]", '\\"prompt_token_ids\\": [', "[", "x"])


@given(
    prompt=st.lists(st.integers(0, 50_000), max_size=50),
    ids=st.lists(st.integers(0, 50_000), max_size=5),
    text=st.lists(st.one_of(TRICKY, st.text(max_size=5)), max_size=6).map("".join),
    spaced=st.booleans(),
)
def test_the_prompt_echo_is_dropped_and_nothing_else_changes(
    prompt: list[int], ids: list[int], text: str, spaced: bool
) -> None:
    choice = {
        "index": 0,
        "text": text,
        "token_ids": ids,
        "prompt_token_ids": prompt,
        "finish_reason": "length",
    }
    answer = {"choices": [choice], "usage": {"prompt_tokens": len(prompt)}}
    raw = json.dumps(answer, separators=(", ", ": ") if spaced else (",", ":")).encode()
    read = loads(raw)
    assert read == {**answer, "choices": [{**choice, "prompt_token_ids": None}]}
    assert loads(json.dumps({"choices": [{"text": text}]}).encode()) == {"choices": [{"text": text}]}


@given(ids=st.lists(st.integers(0, 300_000), max_size=40))
def test_ids_read_from_the_logprobs_tokens_are_the_ids_given(ids: list[int]) -> None:
    """``return_tokens_as_token_ids``' tokens give the ids ``return_token_ids`` would have; the
    latter win where an engine sends both."""
    tokens = [f"token_id:{t}" for t in ids]
    assert token_ids({"logprobs": {"tokens": tokens}}) == ids
    assert token_ids({"token_ids": ids, "logprobs": {"tokens": ["x"] * len(ids)}}) == ids


@pytest.mark.parametrize(
    "tokens",
    [
        ["x"],
        ["token_id:1", "7"],
        ["token_id:1token_id:2"],
        ["token_id:"],
        ["token_id:1,2"],
        ["1token_id:"],
        ["token_id:1", "2token_id:"],
        ["token_id: 5"],
        ["token_id:5 "],
        ["token_id:5_0"],
        ["token_id:+5"],
        ["token_id:-5"],
        ["token_id:\u0665"],  # ARABIC-INDIC DIGIT FIVE: int() reads it as 5
        ["token_id:1", "token_id:\uff12"],  # a fullwidth 2
        ["token_id:1", "token_id:"],
        ["token_id:1", ""],
    ],
)
def test_tokens_that_are_not_token_ids_are_refused(tokens: list[str]) -> None:
    with pytest.raises(EngineError, match="not token ids"):
        token_ids({"logprobs": {"tokens": tokens}})


@pytest.mark.parametrize(
    "choice",
    [{"text": "hello", "logprobs": None}, {"text": "hello"}, {"text": "", "finish_reason": "stop"}],
)
def test_a_choice_without_ids_or_logprobs_is_the_engines_error_not_an_empty_turn(choice: dict) -> None:
    with pytest.raises(EngineError, match="neither token_ids nor logprobs"):
        token_ids(choice)
    # an event with an empty logprobs object (vLLM's, for a step with no token) is no token
    assert token_ids({"text": "", "logprobs": {"tokens": []}}) == []


def test_ids_must_match_the_engines_own_count() -> None:
    check_count(3, {"completion_tokens": 3})
    check_count(3, None)  # no usage sent: nothing to compare
    check_count(3, {"prompt_tokens": 9})
    with pytest.raises(EngineError, match="counted 4 completion tokens but sent 3"):
        check_count(3, {"completion_tokens": 4})


@given(st.one_of(st.text(max_size=14), st.from_regex(r"token_id:[0-9]{0,6}.?", fullmatch=True)))
def test_a_single_token_is_read_as_the_general_rule_reads_it(token: str) -> None:
    """The one-token fast path accepts and refuses what the joined rule does, with the same id."""

    def read(tokens: list[str]) -> list[int] | None:
        try:
            return token_ids({"logprobs": {"tokens": tokens}})
        except EngineError:
            return None

    general = read([token, "token_id:0"])  # two tokens: the general rule
    assert read([token]) == (None if general is None else general[:1])
