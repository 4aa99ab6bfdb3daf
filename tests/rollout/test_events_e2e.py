"""The event contract on real parts: a run's journal holds typed events from the gateway (tool
calls with arguments, completion text) and the white-box agent (tool results), the same events
reach Parquet, and ``collect.score`` computes every reward term from them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.core import EventKind, FinishReason, Trajectory
from rollyard.core.tables import read_parquet
from rollyard.gateway.recorder import SqliteJournal
from rollyard.rl.advantages import turn_advantages
from rollyard.rl.language import is_language_mixed
from rollyard.rl.reward_base import RewardContext, turn_text
from rollyard.rollout.collect import score
from rollyard.rollout.config import Config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir
from rollyard.tasks import load_task

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REWARDS = {
    "outcome": {"name": "judge"},
    "process": {"name": "penalties", "params": {"per_turn_mean": True}},
    "speed": {
        "name": "completion_time",
        "params": {"baseline": "fixed", "baseline_s": 4.0, "only_successful": False},
    },
    "alpha": 1.0,
    "beta": 0.5,
    "judge": {"base_url": "gateway", "max_tokens": 8, "on_unreadable": "zero"},
}


def expected_penalties(t: Trajectory) -> list[float]:
    """Each turn's penalty, recomputed here from the typed events (default weights, mean per turn)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for turn in t.turns:
        events = [e for e in t.events if e.turn_index == turn.index]
        malformed = "malformed_tool_call" in turn.flags or any(
            e.kind == EventKind.TOOL_RESULT and e.payload.malformed for e in events
        )
        error = any(
            e.kind == EventKind.TOOL_RESULT and e.payload.is_error and not e.payload.malformed for e in events
        )
        repeated = False
        for e in events:
            if e.kind == EventKind.TOOL_CALL:
                key = (e.payload.name, json.dumps(e.payload.arguments, sort_keys=True, separators=(",", ":")))
                repeated |= key in seen
                seen.add(key)
        text = turn_text(t, turn)
        mixed = text is not None and is_language_mixed(text, expected=None, min_share=0.1)
        out.append(-(1.0 * malformed + 0.5 * error + 0.5 * repeated + 0.5 * mixed) / t.num_turns)
    return out


async def test_a_recorded_run_carries_typed_events_and_scores_every_term(
    tmp_path: Path, make_config: Callable[..., Config]
) -> None:
    cfg = make_config(
        **{
            "run.steps": 1,
            "agent.tool_choice": "required",
            "agent.max_tokens": 160,  # room for a whole forced tool call
            "rewards": REWARDS,
            "trainer.advantages.mode": "reward_to_go",
        }
    )
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    assert last["count_tool_calls"] > 0 and last["judge_calls"] >= 4
    parquet = {t.program_id: t for t in read_parquet(run.trajectory_file(1))}
    journal = SqliteJournal(run.root / "journal.db")
    try:
        judges = journal.program_ids("judge")
        assert len(judges) == last["judge_calls"]  # the judge asked through the run's own gateway
        assert all(journal.turn_count(p) == 1 for p in judges)
        trajs = [journal.trajectory(p) for p in parquet]
    finally:
        journal.close()
    for t in trajs:
        assert t.events == parquet[t.program_id].events  # kept through Parquet
        kinds = [e.kind for e in t.events]
        # The gateway: one completion per turn, and the call it parsed, with its arguments.
        assert kinds.count(EventKind.COMPLETION) == t.num_turns
        calls = [e.payload for e in t.events if e.kind == EventKind.TOOL_CALL]
        results = [e.payload for e in t.events if e.kind == EventKind.TOOL_RESULT]
        # A forced call can be cut only by max_tokens (engines.tool_grammar bounds it in characters;
        # non-ASCII text can take more tokens): such a turn is text, flagged. Any other unparsed
        # call is a parser bug (one was: a string argument holding "</tool_call>").
        cut = [turn for turn in t.turns if "malformed_tool_call" in turn.flags]
        assert all(turn.finish_reason == FinishReason.LENGTH for turn in cut), [
            (x.index, x.finish_reason) for x in cut
        ]
        assert len(calls) == t.num_turns - len(cut) and all(isinstance(c.arguments, dict) for c in calls)
        assert {e.turn_index for e in t.events if e.kind == EventKind.TOOL_CALL} == {
            turn.index for turn in t.turns if turn not in cut
        }
        # The agent: one result per call it ran, matched by call id.
        assert bool(results) == bool(calls) and {r.call_id for r in results} <= {c.call_id for c in calls}
        assert all(r.duration_s >= 0 and (r.is_error or not r.malformed) for r in results)

    by_group: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, []).append(t)
    # Score a group whose process term has something to count, so its checks are not 0 == 0. Which
    # groups have one is chance (a random model's calls may all run cleanly, without a repeat);
    # a run where none has is itself a failure below.
    groups = sorted(by_group.items())
    gid, group = next(
        ((g, ts) for g, ts in groups if any(sum(expected_penalties(t)) < 0 for t in ts)), groups[0]
    )
    task = load_task(run.root / "tasks" / "train" / group[0].task_id)
    judged = {t.id: 0.25 * (i + 1) for i, t in enumerate(group)}
    rec = score(gid, 0, task, group, cfg, RewardContext(judged=judged))
    per_turn = []
    for t, scored in zip(group, rec.trajectories, strict=True):
        assert scored.outcome is not None
        terms = scored.outcome.reward_terms
        penalties = expected_penalties(t)
        assert terms["outcome"] == pytest.approx(judged[t.id])
        assert terms["process"] == pytest.approx(sum(penalties))
        wall = t.turns[-1].timings.finished - t.turns[0].timings.submitted
        assert 0 < wall < cfg.agent.timeout_s
        assert terms["speed"] == pytest.approx(max(-1.0, min(1.0, 1.0 - wall / 4.0)))
        assert scored.outcome.reward == pytest.approx(judged[t.id] + terms["process"] + 0.5 * terms["speed"])
        penalties[-1] += terms["outcome"] + 0.5 * terms["speed"]
        per_turn.append(penalties)
    assert any(t.outcome.reward_terms["process"] < 0 for t in rec.trajectories if t.outcome)
    # Reward-to-go: each completion token carries its turn's advantage from the per-turn rewards.
    advs = turn_advantages(per_turn, gamma=cfg.trainer.advantages.gamma)
    samples = {s.trajectory_id: s for s in rec.samples if s.meta["segment"] == 0}
    for i, t in enumerate(rec.trajectories):
        first = t.segments[0].turns[0]
        assert samples[t.id].advantages[len(first.prompt_ids)] == pytest.approx(advs[i][0])
