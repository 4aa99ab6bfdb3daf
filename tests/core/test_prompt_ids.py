"""``PromptIds``: what a conversation's prompt remembers of its history (its JSON text, the ids
a turn already checked) never changes what is written or refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core.prompt_ids import PromptIds, ids_json_parts
from rollyard.core.trajectory import FinishReason, Turn, TurnTimings

IDS = st.lists(st.integers(0, 2**31), max_size=30)


def ids_json(ids: list[int]) -> bytes:
    return b"".join(ids_json_parts(ids))


def _turn(prompt: list[int]) -> Turn:
    return Turn.of_valid_parts(
        index=1,
        prompt_ids=prompt,
        completion_ids=[3],
        completion_logprobs=[-0.5],
        policy_version=0,
        finish_reason=FinishReason.STOP,
        timings=TurnTimings(),
        engine=None,
        sampling={},
        requested_sampling={},
        flags=[],
    )


@given(turns=st.lists(st.tuples(IDS, IDS), min_size=1, max_size=6), first=IDS)
def test_json_written_turn_after_turn_equals_the_whole_list_written(
    turns: list[tuple[list[int], list[int]]], first: list[int]
) -> None:
    prompt = PromptIds(first)
    for completion, new in turns:
        assert ids_json(prompt) == json.dumps(list(prompt), separators=(",", ":")).encode()
        prompt = PromptIds.extending(prompt, completion)
        prompt += new
    assert json.loads(ids_json(prompt)) == list(prompt)
    assert json.loads(ids_json(prompt)) == list(prompt)  # the remembered text, asked again


def test_only_what_follows_the_checked_prefix_is_checked_again() -> None:
    prompt = PromptIds.extending([1, 2], [3])
    prompt += [4, -5]
    with pytest.raises(ValueError, match="negative token id"):
        _turn(prompt)
    ok = PromptIds.extending([1, 2], [3])
    ok += [4]
    turn = _turn(ok)
    assert turn.prompt_ids == [1, 2, 3, 4]
    assert json.loads(turn.model_dump_json())["prompt_ids"] == [1, 2, 3, 4]
    assert ok.unchecked() == [4]


def test_shared_ids_are_one_object_per_id_and_keep_their_values() -> None:
    from rollyard.core.prompt_ids import shared_ids

    a = shared_ids([int("70000"), 5, int("1000")])
    b = shared_ids(iter([int("1000"), int("70000")]))
    assert a == [70000, 5, 1000] and b == [1000, 70000]
    assert a[0] is b[1] and a[2] is b[0]  # the same object, wherever the ids came from
    assert shared_ids([-1, 3]) == [-1, 3] and shared_ids([]) == [] and shared_ids([2**31]) == [2**31]


def test_a_long_conversations_json_stays_exact_past_the_pieces_kept() -> None:
    """One piece of text per turn is kept; past ``_MAX_PIECES`` they are joined into one."""
    from rollyard.core.prompt_ids import _MAX_PIECES

    prompt = PromptIds([1])
    for turn in range(2 * _MAX_PIECES + 3):
        assert ids_json(prompt) == json.dumps(list(prompt), separators=(",", ":")).encode()
        assert len(prompt._json[0]) <= _MAX_PIECES
        prompt = PromptIds.extending(prompt, [turn])
        prompt += [turn + 1, 7]
    assert json.loads(ids_json(prompt)) == list(prompt)


def test_the_engine_body_is_the_json_of_its_fields_with_the_prompt_first() -> None:
    from rollyard.engines.vllm_body import body_json

    prompt = PromptIds.extending([5, 6], [7])
    ids_json(prompt)  # remembered: the body writes the rest only
    prompt += [8]
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": False}
    assert json.loads(body_json(body)) == {**body, "prompt": [5, 6, 7, 8]}
    assert list(json.loads(body_json(body))) == ["prompt", "model", "max_tokens", "stream"]
    assert json.loads(body_json({"prompt": [1]})) == {"prompt": [1]}


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), IDS),  # the next turn: prompt + completion, then new ids
        st.tuples(st.just("add"), IDS),
        st.tuples(st.just("cut"), st.integers(0, 40)),  # ids removed from the end
        st.tuples(st.just("post"), st.just([])),
    ),
    max_size=40,
)


@given(_OPS)
def test_the_json_is_always_the_ids_json_whatever_was_done_to_the_prompt(ops: list) -> None:
    """Posted, extended, grown and cut in any order (a cut to nothing included), the text is
    ``json.dumps`` of the ids; a branch extending an earlier prompt never sees a later one's."""
    prompts = [PromptIds([3])]
    for op, arg in ops:
        p = prompts[-1]
        if op == "extend":
            base = prompts[len(arg) % len(prompts)]  # any earlier prompt: a branch
            p = PromptIds.extending(base, arg)
            p += arg[::-1]
            prompts.append(p)
        elif op == "add":
            p += arg
        elif op == "cut":
            del p[max(0, len(p) - arg) :]
        assert ids_json(p) == json.dumps(list(p), separators=(",", ":")).encode()


def test_a_truncated_prompt_writes_what_replaced_its_cut_ids() -> None:
    """A conversation's list is extended in place turn after turn; a turn that failed after
    its ids were posted is cut back (``truncate``) and the next turn appends other ids where
    they were: what was known of the cut ids' JSON must not be written for them."""
    p = PromptIds.extending(PromptIds([1, 2, 3]), [4])  # the next turn's prompt: 4 ids checked
    p += [5, 6, 7]
    ids_json(p)  # posted: JSON known for all 7
    p.truncate(4)
    assert list(p) == [1, 2, 3, 4] and p.checked == 4
    p += [8, 9, 10, 11]  # as long as before, other ids past the cut
    assert ids_json(p) == b"[1,2,3,4,8,9,10,11]"
    p.truncate(2)
    assert p.checked == 2 and p.unchecked() == []
    p.truncate(5)  # longer than the list: nothing to cut
    assert list(p) == [1, 2] and ids_json(p) == b"[1,2]"
