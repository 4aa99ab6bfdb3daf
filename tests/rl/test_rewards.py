"""Reward terms and their composition, hand-computed."""

from __future__ import annotations

from typing import Any

import pytest

from rollyard.core import ConfigError, DataError, Outcome, TurnTimings
from rollyard.rl.reward_base import RewardContext, TermKind, get_reward, register_reward
from rollyard.rl.rewards import JudgeSettings, RewardConfig, TermSpec, reward_to_go, score_group, with_rewards


def test_outcome_terms_read_pass_fraction_or_passed(make_traj: Any) -> None:
    trajs = [
        make_traj([[7]], outcome=Outcome(pass_fraction=0.75)),
        make_traj([[7]], outcome=Outcome(passed=True)),
        make_traj([[7]], outcome=Outcome(status="timeout")),
    ]
    frac = score_group(trajs, RewardConfig())
    assert [s.total for s in frac] == [0.75, 1.0, 0.0]
    binary = score_group(trajs, RewardConfig(outcome=TermSpec(name="binary", params={"failure": -1.0})))
    assert [s.total for s in binary] == [-1.0, 1.0, -1.0]


def test_process_penalties_count_each_kind_per_turn(make_traj: Any) -> None:
    traj = make_traj(
        [[10], [11], [12], [13]],
        flags={0: ["malformed_tool_call"]},
        tool_calls={1: [("bash", {"cmd": "ls", "x": 1})], 2: [("bash", '{"x": 1, "cmd": "ls"}')]},
        tool_errors={2},
        texts={3: "我们先看 the failing test 然后修改"},
        outcome=Outcome(passed=True),
    )
    cfg = RewardConfig(process=TermSpec(name="penalties"), alpha=2.0)
    (s,) = score_group([traj], cfg)
    # per turn: malformed 1.0; clean; repeated 0.5 + tool error 0.5; mixing 0.5; each / 4 turns
    assert s.process == pytest.approx(-(1.0 + 0.0 + 1.0 + 0.5) / 4)
    assert s.per_turn == pytest.approx([-0.5, 0.0, -0.5, -0.25 + 1.0])  # last turn adds the outcome
    assert s.total == pytest.approx(1.0 + 2.0 * s.process)


def test_arguments_nested_past_what_json_reads_count_as_text(make_traj: Any) -> None:
    deep = "[" * 100_000  # a RecursionError in json.loads, not a ValueError
    traj = make_traj([[10], [11]], tool_calls={0: [("bash", deep)], 1: [("bash", " " + deep)]})
    cfg = RewardConfig(process=TermSpec(name="penalties", params={"per_turn_mean": False}), alpha=1.0)
    (s,) = score_group([traj], cfg)
    assert s.per_turn == pytest.approx([0.0, -0.5])  # the same text again: a repeated call


def test_penalty_weights_of_zero_switch_a_check_off(make_traj: Any) -> None:
    traj = make_traj(
        [[10]], flags={0: ["malformed_tool_call"]}, tool_calls={0: [("bash", "ls")]}, tool_errors={0}
    )
    cfg = RewardConfig(
        process=TermSpec(name="penalties", params={"malformed_tool_call": 0.0, "per_turn_mean": False}),
        alpha=1.0,
    )
    assert score_group([traj], cfg)[0].process == pytest.approx(-0.5)


def test_speed_rewards_faster_successes_relative_to_the_group(make_traj: Any) -> None:
    trajs = [
        make_traj([[1]], outcome=Outcome(passed=True), duration=50.0),
        make_traj([[1]], outcome=Outcome(passed=True), duration=150.0),
        make_traj([[1]], outcome=Outcome(passed=False), duration=10.0),
    ]
    cfg = RewardConfig(outcome=TermSpec(name="binary"), speed=TermSpec(name="completion_time"), beta=0.5)
    scores = score_group(trajs, cfg)
    # baseline: mean of successes = 100 s; h(x) = 1 - x; the failure gets no speed reward
    assert [s.speed for s in scores] == pytest.approx([0.5, -0.5, 0.0])
    assert [s.total for s in scores] == pytest.approx([1.25, 0.75, 0.0])


def test_speed_shapes_are_decreasing_and_clipped(make_traj: Any) -> None:
    trajs = [make_traj([[1]], outcome=Outcome(passed=True), duration=d) for d in (5.0, 20.0, 80.0)]
    for h in ("linear", "log", "inverse"):
        spec = TermSpec(
            name="completion_time", params={"baseline": "fixed", "baseline_s": 20.0, "h": h, "clip": 1.0}
        )
        speeds = [s.speed for s in score_group(trajs, RewardConfig(speed=spec, beta=1.0))]
        assert speeds[0] > speeds[1] == 0.0 > speeds[2] and all(-1.0 <= v <= 1.0 for v in speeds)


def test_speed_is_the_agents_wall_time_not_the_tests_run_time(make_traj: Any) -> None:
    traj = make_traj([[1], [2]], outcome=Outcome(passed=True, duration_s=999.0))
    traj.turns[0].timings = TurnTimings(submitted=3.0, finished=4.0)
    traj.turns[1].timings = TurnTimings(submitted=5.0, finished=13.0)
    spec = TermSpec(name="completion_time", params={"baseline": "fixed", "baseline_s": 20.0})
    assert score_group([traj], RewardConfig(speed=spec, beta=1.0))[0].speed == pytest.approx(0.5)


def test_no_success_in_the_group_means_no_speed_reward(make_traj: Any) -> None:
    trajs = [make_traj([[1]], outcome=Outcome(passed=False), duration=d) for d in (1.0, 9.0)]
    scores = score_group(trajs, RewardConfig(speed=TermSpec(name="completion_time"), beta=1.0))
    assert [s.speed for s in scores] == [0.0, 0.0]


def test_reward_to_go_discounts_later_rewards() -> None:
    assert reward_to_go([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])
    assert reward_to_go([], 0.9) == []
    with pytest.raises(DataError):
        reward_to_go([1.0], 1.5)
    with pytest.raises(DataError):
        reward_to_go([float("nan")], 1.0)


def test_per_turn_rewards_sum_to_the_total_so_undiscounted_return_matches(make_traj: Any) -> None:
    traj = make_traj(
        [[1], [2], [3]], tool_calls={1: [("bash", "ls")]}, tool_errors={1}, outcome=Outcome(passed=True)
    )
    cfg = RewardConfig(
        process=TermSpec(name="penalties"),
        speed=TermSpec(name="completion_time", params={"baseline": "fixed", "baseline_s": 10.0}),
        alpha=0.3,
        beta=0.2,
    )
    (s,) = score_group([traj], cfg)
    assert reward_to_go(s.per_turn, 1.0)[0] == pytest.approx(s.total)


def test_registered_terms_are_found_by_name_and_kind() -> None:
    @register_reward("test_constant_outcome", TermKind.OUTCOME)
    def constant(trajs: Any, params: dict[str, Any], ctx: RewardContext) -> list[float]:
        return [float(params["value"])] * len(trajs)

    assert get_reward("test_constant_outcome").fn is constant
    with pytest.raises(ConfigError):
        get_reward("test_constant_outcome", TermKind.SPEED)
    with pytest.raises(ConfigError):
        get_reward("no_such_term")
    with pytest.raises(ConfigError):
        register_reward("binary", TermKind.OUTCOME)(constant)


def test_bad_groups_and_bad_terms_raise_clear_errors(make_traj: Any) -> None:
    with pytest.raises(DataError, match="empty"):
        score_group([], RewardConfig())
    no_outcome = make_traj([[1]])
    no_outcome.outcome = None
    with pytest.raises(DataError, match="no outcome"):
        score_group([no_outcome], RewardConfig())

    @register_reward("test_nan_outcome", TermKind.OUTCOME)
    def nan(trajs: Any, params: dict[str, Any], ctx: RewardContext) -> list[float]:
        return [float("nan")] * len(trajs)

    with pytest.raises(DataError, match="NaN"):
        score_group([make_traj([[1]])], RewardConfig(outcome=TermSpec(name="test_nan_outcome")))
    with pytest.raises(ConfigError, match="unknown reward parameters"):
        score_group([make_traj([[1]])], RewardConfig(outcome=TermSpec(name="binary", params={"sucess": 1})))
    judge = RewardConfig(outcome=TermSpec(name="judge"), judge=JudgeSettings())
    with pytest.raises(ConfigError, match="no judge score"):
        score_group([make_traj([[1]])], judge)


def test_with_rewards_fills_outcome_reward_and_terms(make_traj: Any) -> None:
    trajs = [make_traj([[1]], outcome=Outcome(pass_fraction=0.5))]
    scores = score_group(trajs, RewardConfig())
    (out,) = with_rewards(trajs, scores)
    assert out.outcome is not None and out.outcome.reward == 0.5
    assert out.outcome.reward_terms == {"outcome": 0.5, "process": 0.0, "speed": 0.0}
    assert trajs[0].outcome is not None and trajs[0].outcome.reward is None


def test_forced_score_judge_calls_a_tool_whose_argument_is_an_integer_of_the_scale() -> None:
    tool = JudgeSettings(scale=(1, 5), forced_score=True).score_tool()["function"]
    assert tool["name"] == "score"
    assert tool["parameters"]["properties"]["score"] == {"type": "integer", "enum": [1, 2, 3, 4, 5]}
    with pytest.raises(ValueError, match="forced_score"):
        JudgeSettings(scale=(0.2, 0.8), forced_score=True)  # no integer on the scale
