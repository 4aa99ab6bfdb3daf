"""Advantages (GRPO, reward-to-go, chunked MDP) and the samples built from them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import DataError, Outcome
from rollyard.rl.advantages import (
    AdvantageConfig,
    advantage_bound,
    build_samples,
    chunk_advantages,
    group_samples,
    grpo_advantages,
    turn_advantages,
    turn_chunks,
)


def test_grpo_centres_and_scales_by_population_std() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5
    assert grpo_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert grpo_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=False) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_leave_one_out_uses_the_mean_of_the_others() -> None:
    # r = 3, 0, 0: baselines 0, 1.5, 1.5
    assert grpo_advantages([3.0, 0.0, 0.0], leave_one_out=True, normalize_std=False) == pytest.approx(
        [3.0, -1.5, -1.5]
    )


def test_degenerate_groups_follow_the_documented_rules() -> None:
    assert grpo_advantages([0.7]) == [0.0]
    assert grpo_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert turn_advantages([[1.0, 2.0]]) == [[0.0, 0.0]]
    with pytest.raises(DataError, match="empty"):
        grpo_advantages([])
    with pytest.raises(DataError, match="NaN"):
        grpo_advantages([1.0, float("nan")])
    with pytest.raises(DataError, match="NaN"):
        grpo_advantages([1.0, float("inf")])


def test_turn_advantages_use_discounted_returns_against_the_group_baseline() -> None:
    rewards = [[0.0, -0.5, 1.0], [0.0, 0.0]]
    adv = turn_advantages(rewards, gamma=0.5, normalize_std=False)
    # returns: [0.0, 0.0, 1.0] and [0.0, 0.0]; baseline = mean(0.0, 0.0) = 0
    assert adv == [pytest.approx([0.0, 0.0, 1.0]), pytest.approx([0.0, 0.0])]
    adv1 = turn_advantages([[0.0, 1.0], [0.0, 0.0]], gamma=1.0)
    # full returns 1 and 0: mean 0.5, std 0.5
    assert adv1 == [pytest.approx([1.0, 1.0]), pytest.approx([-1.0, -1.0])]


def test_turn_advantages_with_only_a_final_reward_equal_grpo() -> None:
    finals = [0.2, 1.0, 0.0, 0.7]
    rewards = [[0.0] * k + [r] for k, r in zip([2, 0, 3, 1], finals, strict=True)]
    grpo = grpo_advantages(finals, leave_one_out=True)
    per_turn = turn_advantages(rewards, gamma=1.0, leave_one_out=True)
    for a, row in zip(grpo, per_turn, strict=True):
        assert row == pytest.approx([a] * len(row))


def test_chunks_break_after_environment_interactions(make_traj: Any) -> None:
    traj = make_traj([[1], [2], [3], [4]], tool_calls={0: [("bash", "ls")], 2: [("bash", "pwd")]})
    assert turn_chunks(traj) == [0, 1, 1, 2]
    assert turn_chunks(make_traj([[1], [2]])) == [0, 0]


def test_chunk_advantage_is_discounted_by_chunks_to_the_end(make_traj: Any) -> None:
    win = make_traj([[1], [2], [3]], tool_calls={0: [("a", "1")], 1: [("b", "2")]})
    lose = make_traj([[1]])
    advs, chunks = chunk_advantages([win, lose], [1.0, 0.0], gamma=0.5)
    # GRPO advantages +1 / -1; win has chunks 0, 1, 2 -> gamma^2, gamma^1, gamma^0
    assert chunks == [[0, 1, 2], [0]]
    assert advs == [pytest.approx([0.25, 0.5, 1.0]), pytest.approx([-1.0])]
    same, _ = chunk_advantages([win, lose], [1.0, 0.0], gamma=1.0)
    assert same == [pytest.approx([1.0, 1.0, 1.0]), pytest.approx([-1.0])]


def test_samples_carry_turn_advantages_and_chunk_ids_on_completion_tokens(make_traj: Any) -> None:
    traj = make_traj([[10, 11], [12]], versions=[3, 4])
    (s,) = build_samples([traj], [[0.5, -2.0]], [1.0], [[0, 1]])
    # tokens: prompt [1, 2] | turn 0: 10, 11 | observation 901 | turn 1: 12
    assert s.token_ids == [1, 2, 10, 11, 901, 12]
    assert s.loss_mask == [0, 0, 1, 1, 0, 1]
    assert s.advantages == [0.0, 0.0, 0.5, 0.5, 0.0, -2.0]
    assert s.chunk_ids == [-1, -1, 0, 0, -1, 1]
    assert s.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert s.policy_version == 3 and s.trajectory_id == traj.id and s.reward == 1.0


def test_a_history_rewrite_yields_one_sample_per_segment(make_traj: Any) -> None:
    traj = make_traj([[10], [11], [12]], rewrite_at=2)
    samples = build_samples([traj], [[1.0, 2.0, 3.0]], [0.0])
    assert len(samples) == 2
    assert samples[0].advantages == [0.0, 0.0, 1.0, 0.0, 2.0]
    assert samples[1].token_ids == [5, 6, 7, 12] and samples[1].advantages == [0.0, 0.0, 0.0, 3.0]
    assert [s.meta["segment"] for s in samples] == [0, 1]


def test_group_samples_run_each_mode_from_config(make_traj: Any) -> None:
    trajs = [
        make_traj([[10], [11]], tool_calls={0: [("x", "1")]}, outcome=Outcome(passed=True, reward=1.0)),
        make_traj([[12]], outcome=Outcome(passed=False, reward=0.0)),
    ]
    grpo = group_samples(trajs, AdvantageConfig())
    assert [max(s.advantages, key=abs) for s in grpo] == pytest.approx([1.0, -1.0])
    chunk = group_samples(trajs, AdvantageConfig(mode="chunk", gamma=0.9))
    assert chunk[0].chunk_ids is not None and sorted(set(chunk[0].chunk_ids)) == [-1, 0, 1]
    assert [a for a in chunk[0].advantages if a] == pytest.approx([0.9, 1.0])
    rtg = group_samples(trajs, AdvantageConfig(mode="reward_to_go"), turn_rewards=[[0.0, 1.0], [0.0]])
    assert [a for a in rtg[0].advantages if a] == pytest.approx([1.0, 1.0])
    with pytest.raises(DataError, match="per-turn"):
        group_samples(trajs, AdvantageConfig(mode="reward_to_go"))


def test_group_samples_reject_missing_or_mismatched_rewards(make_traj: Any) -> None:
    trajs = [make_traj([[10]]), make_traj([[11]])]
    with pytest.raises(DataError, match="no reward"):
        group_samples(trajs, AdvantageConfig())
    with pytest.raises(DataError, match="rewards"):
        group_samples(trajs, AdvantageConfig(), rewards=[1.0])
    with pytest.raises(DataError):
        group_samples([], AdvantageConfig())
    with pytest.raises(DataError, match="per turn"):
        build_samples(trajs, [[1.0], [1.0, 2.0]], [0.0, 0.0])
    assert all(
        math.isfinite(a) for s in group_samples(trajs, AdvantageConfig(), [1.0, 1.0]) for a in s.advantages
    )


def test_chunk_returns_discount_the_per_chunk_rewards(make_traj: Any) -> None:
    # win: 3 turns, each followed by a tool call -> chunks 0, 1, 2; lose: one turn, one chunk
    win = make_traj([[1], [2], [3]], tool_calls={0: [("bash", "a")], 1: [("bash", "b")], 2: [("bash", "c")]})
    lose = make_traj([[4]])
    per_turn = [[-0.5, 0.0, 1.5], [0.0]]  # totals 1.0 and 0.0: GRPO baseline 0.5, std 0.5
    advs, chunks = chunk_advantages([win, lose], [1.0, 0.0], turn_rewards=per_turn, gamma=0.5)
    assert chunks == [[0, 1, 2], [0]]
    returns = [-0.5 + 0.5 * 0.0 + 0.25 * 1.5, 0.0 + 0.5 * 1.5, 1.5]
    expected = [(g - 0.5**p * 0.5) / 0.5 for g, p in zip(returns, (2, 1, 0), strict=True)]
    assert advs == [pytest.approx(expected), pytest.approx([-1.0])]
    # a final reward only is the same as no per-turn rewards
    final, _ = chunk_advantages([win, lose], [1.0, 0.0], turn_rewards=[[0, 0, 1.0], [0.0]], gamma=0.5)
    plain, _ = chunk_advantages([win, lose], [1.0, 0.0], gamma=0.5)
    assert final == [pytest.approx(a) for a in plain]


def test_near_equal_rewards_give_chunk_advantages_on_the_grpo_scale(make_traj: Any) -> None:
    # the audit's group: totals -0.18762 and -0.18738 (std 1.2e-4), per-chunk rewards ~0.1
    a = make_traj([[1], [2], [3]], tool_calls={0: [("bash", "a")], 1: [("bash", "b")]})
    b = make_traj([[4], [5]], tool_calls={0: [("bash", "c")]})
    per_turn = [[0.1, -0.2, -0.08762], [-0.1, -0.08738]]
    advs, _ = chunk_advantages([a, b], [-0.18762, -0.18738], turn_rewards=per_turn, gamma=0.9)
    flat = [x for row in advs for x in row]
    assert max(abs(x) for x in flat) <= advantage_bound(2) == 2.0
    assert max(abs(x) for x in flat) == pytest.approx(2.0)  # the divisor is max|c| / B here
    assert grpo_advantages([-0.18762, -0.18738]) == pytest.approx([-1.0, 1.0])


_REWARDS = st.one_of(
    st.floats(-10, 10),
    st.floats(-0.2, -0.18).map(lambda x: round(x, 5)),  # near-equal, as in the audit
    st.sampled_from([0.0, 1.0]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.lists(_REWARDS, min_size=1, max_size=4), min_size=2, max_size=6),
    st.floats(0.0, 1.0),
    st.booleans(),
    st.booleans(),
)
def test_advantages_stay_within_the_stated_bound_at_every_level(
    make_traj: Any, turn_rewards: list[list[float]], gamma: float, loo: bool, per_turn: bool
) -> None:
    n = len(turn_rewards)
    bound = advantage_bound(n) * (1 + 1e-9)
    totals = [sum(r) for r in turn_rewards]
    assert all(abs(x) <= bound for x in grpo_advantages(totals, leave_one_out=loo))
    rtg = turn_advantages(turn_rewards, gamma=gamma, leave_one_out=loo)
    assert all(abs(x) <= bound for row in rtg for x in row)
    trajs = [
        make_traj(
            [[1 + k] for k in range(len(r))], tool_calls={k: [("bash", "x")] for k in range(len(r) - 1)}
        )
        for r in turn_rewards
    ]
    advs, _ = chunk_advantages(
        trajs, totals, turn_rewards=turn_rewards if per_turn else None, gamma=gamma, leave_one_out=loo
    )
    assert all(abs(x) <= bound for row in advs for x in row)
