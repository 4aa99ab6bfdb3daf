"""``PromptIds``: what a conversation's prompt remembers of its history (its JSON text, the ids
a turn already checked) never changes what is written or refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core.prompt_ids import PromptIds, ids_json
from rollyard.core.trajectory import FinishReason, Turn, TurnTimings

IDS = st.lists(st.integers(0, 2**31), max_size=30)


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
