"""Trajectories survive Parquet and JSONL round trips exactly; bad files give DataError."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import DataError, Event, EventKind, Outcome, Trajectory, Turn
from rollyard.core.tables import read_jsonl, read_parquet, to_table, write_jsonl, write_parquet

token = st.integers(0, 60000)
logprob = st.floats(-30.0, 0.0, allow_nan=False).map(lambda x: float(__import__("numpy").float32(x)))


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    t = Trajectory(
        program_id=draw(st.text(min_size=1, max_size=8)),
        group_id=draw(st.sampled_from(["g1", "g2"])),
        task_id="task",
        metadata={"seed": draw(st.integers(0, 9))},
    )
    prompt = draw(st.lists(token, min_size=1, max_size=10))
    for i in range(draw(st.integers(0, 4))):
        comp = draw(st.lists(token, max_size=6))
        lps = draw(st.lists(logprob, min_size=len(comp), max_size=len(comp)))
        if draw(st.booleans()) and i > 0:
            prompt = draw(st.lists(token, min_size=1, max_size=10))  # a rewrite
        t.add_turn(
            Turn(
                index=i,
                prompt_ids=prompt,
                completion_ids=comp,
                completion_logprobs=lps,
                policy_version=draw(st.integers(0, 5)),
                sampling={"temperature": 1.0},
                flags=["malformed_tool_call"] if draw(st.booleans()) else [],
                forced=[(0, len(comp))] if comp and draw(st.booleans()) else [],
            )
        )
        prompt = prompt + comp + draw(st.lists(token, max_size=4))
    t.events.append(
        Event(kind=EventKind.TOOL_CALL, turn_index=0, data={"name": "bash", "arguments": {"c": "ls"}})
    )
    if draw(st.booleans()):
        t.outcome = Outcome(status="success", passed=True, pass_fraction=1.0, reward=draw(st.floats(-5, 5)))
    return t


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trajs=st.lists(trajectories(), max_size=4))
def test_parquet_and_jsonl_round_trip_exactly(trajs: list[Trajectory], tmp_path: Path) -> None:
    assert read_parquet(write_parquet(tmp_path / "t.parquet", trajs)) == trajs
    assert read_jsonl(write_jsonl(tmp_path / "t.jsonl", trajs)) == trajs


def test_parquet_token_ids_are_typed_lists(tmp_path: Path) -> None:
    t = Trajectory(program_id="p")
    t.add_turn(Turn(prompt_ids=[1, 2], completion_ids=[3], completion_logprobs=[-1.0]))
    path = write_parquet(tmp_path / "x.parquet", [t])
    table = pq.read_table(path)
    assert table.schema.field("segments").type == to_table([t]).schema.field("segments").type
    assert table.column("segments").to_pylist()[0][0][0]["prompt_ids"] == [1, 2]


def test_corrupt_files_raise_data_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DataError):
        read_parquet(bad)
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"program_id": "p", "schema_version": 99}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        read_jsonl(jl)


def test_writes_leave_no_partial_file_on_failure(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    def gen():
        yield Trajectory(program_id="p")
        raise Boom

    with pytest.raises(Boom):
        write_jsonl(tmp_path / "t.jsonl", gen())
    assert list(tmp_path.iterdir()) == []
