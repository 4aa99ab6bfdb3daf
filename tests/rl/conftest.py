"""Shared builders for the rl tests: small, token-exact trajectories."""

from __future__ import annotations

from typing import Any

import pytest

from rollyard.core import (
    CompletionEvent,
    Event,
    Outcome,
    ToolCallEvent,
    ToolResultEvent,
    Trajectory,
    Turn,
    TurnTimings,
)


def make_trajectory(
    completions: list[list[int]],
    *,
    group_id: str = "g",
    outcome: Outcome | None = None,
    flags: dict[int, list[str]] | None = None,
    tool_calls: dict[int, list[tuple[str, Any]]] | None = None,
    tool_errors: set[int] | None = None,
    texts: dict[int, str] | None = None,
    versions: list[int] | None = None,
    rewrite_at: int | None = None,
    duration: float | None = None,
) -> Trajectory:
    """Turn i's prompt extends turn i-1 with one observation token (900 + i); a rewrite at
    turn k starts it from a fresh prompt, so it opens a new segment."""
    traj = Trajectory(program_id="p", group_id=group_id, outcome=outcome or Outcome(status="success"))
    prompt = [1, 2]
    prev: Turn | None = None
    for i, comp in enumerate(completions):
        if prev is not None:
            prompt = [5, 6, 7] if i == rewrite_at else prev.prompt_ids + prev.completion_ids + [900 + i]
        turn = Turn(
            index=i,
            prompt_ids=list(prompt),
            completion_ids=comp,
            completion_logprobs=[-0.5] * len(comp),
            flags=(flags or {}).get(i, []),
            policy_version=(versions or [0] * len(completions))[i],
        )
        traj.add_turn(turn)
        for name, args in (tool_calls or {}).get(i, []):
            traj.events.append(Event.of(ToolCallEvent(name=name, arguments=args), turn_index=i))
            is_error = i in (tool_errors or set())
            traj.events.append(Event.of(ToolResultEvent(name=name, is_error=is_error), turn_index=i))
        if texts and i in texts:
            traj.events.append(Event.of(CompletionEvent(text=texts[i]), turn_index=i))
        prev = turn
    if duration is not None:  # the agent's wall time: first request to last response
        traj.turns[0].timings = TurnTimings(submitted=0.0, finished=min(duration, 0.1))
        traj.turns[-1].timings = TurnTimings(submitted=0.0, finished=duration)
    return traj


@pytest.fixture
def make_traj() -> Any:
    return make_trajectory
