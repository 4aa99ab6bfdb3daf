"""A run whose programs never reach the model stops with the agent's own error."""

from __future__ import annotations

from rollyard.core import Segment, Trajectory, Turn
from rollyard.core.trajectory import Outcome
from rollyard.rollout.silence import SilentPrograms, why_silent


def traj(turns: int, **details: object) -> Trajectory:
    made = [
        Turn(index=i, prompt_ids=[1, 2], completion_ids=[3], completion_logprobs=[-0.5]) for i in range(turns)
    ]
    segments = [Segment(turns=made)] if made else []
    return Trajectory(program_id="p", segments=segments, outcome=Outcome(status="failure", details=details))


def test_programs_without_a_turn_in_a_row_trip_the_guard_with_the_last_error() -> None:
    guard = SilentPrograms(limit=3)
    guard.observe([traj(0, agent_error="cli exited with status 127: not found"), traj(0)])
    assert guard.streak == 2 and not guard.tripped
    guard.observe([traj(1)])  # one program that reached the model resets the count
    assert guard.streak == 0
    guard.observe([traj(0), traj(0), traj(0, agent_error="cli exited with status 2: bad flag --x")])
    assert guard.tripped
    err = guard.error()
    assert err.code == "agent_failed"
    assert "3 programs in a row" in err.message and "bad flag --x" in err.message


def test_a_silent_program_without_an_error_says_its_status() -> None:
    assert why_silent(traj(0, agent_status="timeout")) == "agent status 'timeout', no error output"
    assert why_silent(traj(0, error="sandbox died")) == "sandbox died"
