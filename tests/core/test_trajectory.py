"""Token-exact records: invariants hold on construction, rewrites start segments."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rollyard.core import EventKind, FinishReason, Sample, Segment, Trajectory, Turn
from rollyard.core.trajectory import TurnTimings


def turn(prompt: list[int], completion: list[int], index: int = 0, version: int = 0) -> Turn:
    return Turn(
        index=index,
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        policy_version=version,
    )


def test_turn_rejects_mismatched_logprobs() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        Turn(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-0.1])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.5])
def test_turn_rejects_non_finite_or_positive_logprobs(bad: float) -> None:
    for lps in ([bad], [-0.1, bad], [bad, -0.1]):
        with pytest.raises(ValueError, match=f"logprob {bad!r} is not a finite"):
            Turn(prompt_ids=[1], completion_ids=[2] * len(lps), completion_logprobs=lps)


def test_turn_rejects_negative_token_ids() -> None:
    for prompt, completion in (([1, -2], [3]), ([1], [3, -1]), ([-1], [])):
        with pytest.raises(ValueError, match="negative token id"):
            Turn(prompt_ids=prompt, completion_ids=completion, completion_logprobs=[-0.5] * len(completion))


def test_turn_token_ids_past_64_bits_are_not_negative() -> None:
    assert Turn(prompt_ids=[1, 2**70], completion_ids=[2**64], completion_logprobs=[-0.5])
    with pytest.raises(ValueError, match="negative token id"):
        Turn(prompt_ids=[2**70, -1], completion_ids=[], completion_logprobs=[])


def test_turn_rejects_empty_prompt_and_bad_mask() -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        Turn(prompt_ids=[], completion_ids=[2], completion_logprobs=[-1.0])
    with pytest.raises(ValueError, match="mask"):
        Turn(prompt_ids=[1], completion_ids=[2], completion_logprobs=[-1.0], loss_mask=[2])


def _parts(**change: object) -> dict[str, object]:
    parts: dict[str, object] = {
        "index": 2,
        "prompt_ids": [1, 2, 3],
        "completion_ids": [4, 5],
        "completion_logprobs": [-0.5, -1.25],
        "policy_version": 3,
        "finish_reason": FinishReason.LENGTH,
        "timings": TurnTimings(submitted=1.0, started=2.0, finished=3.5),
        "engine": "e0",
        "sampling": {"max_tokens": 2, "temperature": 1.0, "stop_token_ids": []},
        "requested_sampling": {"max_tokens": 2},
        "flags": ["constrained_decoding"],
    }
    return {**parts, **change}


def test_turn_of_valid_parts_is_the_validated_turn() -> None:
    built, assembled = Turn(**_parts()), Turn.of_valid_parts(**_parts())  # type: ignore[arg-type]
    assert assembled == built
    assert assembled.model_dump_json() == built.model_dump_json()
    assert assembled.model_fields_set == built.model_fields_set


@pytest.mark.parametrize(
    "bad",
    [
        {"completion_logprobs": [-0.5]},
        {"completion_logprobs": [-0.5, math.nan]},
        {"completion_logprobs": [-0.5, 0.5]},
        {"prompt_ids": []},
        {"prompt_ids": [1, -2]},
        {"completion_ids": [4, -5]},
        {"index": -1},
        {"prompt_ids": [1, "x"]},
        {"policy_version": -1},
    ],
)
def test_turn_of_valid_parts_raises_what_turn_raises(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as built:
        Turn(**_parts(**bad))
    with pytest.raises(ValidationError) as assembled:
        Turn.of_valid_parts(**_parts(**bad))  # type: ignore[arg-type]
    assert str(assembled.value) == str(built.value)


def test_segment_rejects_a_turn_that_does_not_extend_the_previous() -> None:
    with pytest.raises(ValueError, match="does not extend"):
        Segment(turns=[turn([1, 2], [3]), turn([1, 9, 3, 4], [5], index=1)])


def test_a_history_rewrite_starts_a_new_segment_and_records_an_event() -> None:
    t = Trajectory(program_id="p")
    assert not t.add_turn(turn([1, 2], [3, 4]))
    assert not t.add_turn(turn([1, 2, 3, 4, 5], [6], index=1))
    assert t.add_turn(turn([1, 7], [8], index=2))  # the agent dropped history
    assert len(t.segments) == 2
    assert [e.kind for e in t.events] == [EventKind.CONTEXT_REWRITE]
    assert t.events[0].turn_index == 2
    assert t.num_turns == 3


def test_segment_flatten_masks_prompts_and_observations() -> None:
    seg = Segment(turns=[turn([1, 2], [3, 4]), turn([1, 2, 3, 4, 5, 6], [7], index=1)])
    ids, mask, lps = seg.flatten()
    assert ids == [1, 2, 3, 4, 5, 6, 7]
    assert mask == [0, 0, 1, 1, 0, 0, 1]
    assert lps == [0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5]
    s = Sample.from_segment(seg, advantage=2.0)
    assert s.num_loss_tokens == 3
    assert s.advantages == [2.0] * 7


def test_sample_rejects_a_trained_first_token_and_length_mismatch() -> None:
    with pytest.raises(ValueError, match="first token"):
        Sample(token_ids=[1, 2], loss_mask=[1, 1], logprobs=[0, 0], advantages=[0, 0])
    with pytest.raises(ValueError, match="advantages"):
        Sample(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0, 0], advantages=[0])
    with pytest.raises(ValueError, match="finite"):
        Sample(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0, 0], advantages=[0, math.nan])


@given(
    prompt=st.lists(st.integers(0, 5000), min_size=1, max_size=20),
    steps=st.lists(
        st.tuples(st.lists(st.integers(0, 5000), max_size=8), st.lists(st.integers(0, 5000), max_size=8)),
        max_size=6,
    ),
)
def test_extending_turns_always_stay_in_one_segment(
    prompt: list[int], steps: list[tuple[list[int], list[int]]]
) -> None:
    t = Trajectory(program_id="p")
    p = list(prompt)
    for i, (completion, observation) in enumerate(steps):
        t.add_turn(turn(p, completion, index=i))
        p = p + completion + observation + [1]
    assert len(t.segments) <= 1
    assert not t.events
    if t.segments:
        ids, mask, _ = t.segments[0].flatten()
        assert sum(mask) == sum(len(c) for c, _ in steps)
        assert ids[: len(prompt)] == prompt


@pytest.mark.parametrize("runs", [[(0, 3)], [(1, 1)], [(1, 2), (0, 1)], [(0, 2), (1, 2)], [(-1, 1)]])
def test_turn_rejects_forced_runs_out_of_order_or_range(runs: list[tuple[int, int]]) -> None:
    with pytest.raises(ValidationError, match="forced runs"):
        Turn(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-0.1, 0.0], forced=runs)


def test_a_segment_flags_its_forced_tokens_and_the_sample_carries_them() -> None:
    t0 = Turn(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-0.1, 0.0], forced=[(0, 2)])
    t1 = Turn(index=1, prompt_ids=[1, 2, 3, 4], completion_ids=[5, 6], completion_logprobs=[-0.2, -0.3])
    seg = Segment(turns=[t0, t1])
    assert seg.forced_mask() == [0, 1, 1, 0, 0, 0]
    assert Sample.from_segment(seg).forced == [0, 1, 1, 0, 0, 0]
    assert Segment(turns=[t1]).forced_mask() is None
