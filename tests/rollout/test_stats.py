"""Per-episode figures read from recorded events."""

from __future__ import annotations

import pytest

from rollyard.core.events import CompletionEvent, Event, ToolCallEvent
from rollyard.core.trajectory import Trajectory
from rollyard.rollout.stats import first_call, first_call_stats


def episode(*calls: str) -> Trajectory:
    t = Trajectory(program_id="p", group_id="g")
    t.events.append(Event.of(CompletionEvent(text="thinking"), turn_index=0))
    t.events += [Event.of(ToolCallEvent(name=c), turn_index=i) for i, c in enumerate(calls)]
    return t


def test_the_first_tool_call_and_how_each_opening_went() -> None:
    eps = [episode("bash", "write_file"), episode("write_file"), episode("bash"), episode()]
    assert [first_call(t) for t in eps] == ["bash", "write_file", "bash", "none"]
    stats = first_call_stats(eps, [1.0, 0.0, 0.0, 0.0], prefix="eval_")
    assert stats == {
        "eval_first_bash": 0.5,
        "eval_success_first_bash": 0.5,
        "eval_first_none": 0.25,
        "eval_success_first_none": 0.0,
        "eval_first_write_file": 0.25,
        "eval_success_first_write_file": 0.0,
    }
    with pytest.raises(ValueError):
        first_call_stats(eps, [1.0], prefix="")
