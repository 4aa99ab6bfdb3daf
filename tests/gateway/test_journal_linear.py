"""The journal stores each turn's new tokens only (issue 38): bytes linear in tokens, full
prompts rebuilt exactly on read, reads off the event loop, schema-1 journals migrated."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rollyard.bench._journal_size import (
    BYTES_PER_NEW_TOKEN,
    FIXED_BYTES_PER_TURN,
    conversation,
    journal_bytes_per_new_token,
)
from rollyard.core.errors import ConfigError
from rollyard.core.program import Program
from rollyard.core.trajectory import Segment, Trajectory, Turn
from rollyard.gateway.journal_rows import pack_ids, pack_logprobs, unpack
from rollyard.gateway.journal_schema import SCHEMA_V1
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import ConversationState, Renderer
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.gateway.types import Message


def test_bytes_per_new_token_stay_within_the_bound_and_do_not_grow_with_turns(tiny_model_dir: Path) -> None:
    short = journal_bytes_per_new_token(tiny_model_dir, turns=12)
    long = journal_bytes_per_new_token(tiny_model_dir, turns=48)
    for r in (short, long):
        assert (
            r["journal_bytes"] <= BYTES_PER_NEW_TOKEN * r["new_tokens"] + FIXED_BYTES_PER_TURN * r["turns"]
        ), r
        assert r["within_bound"], r
    assert long["context_tokens"] > 3 * short["context_tokens"]
    # linear: a 4x longer conversation costs about the same per token; schema 1's cost grew with it
    assert long["journal_bytes_per_new_token"] < 1.3 * short["journal_bytes_per_new_token"], (short, long)
    assert long["journal_bytes_per_new_token_v1"] > 3 * short["journal_bytes_per_new_token_v1"], (short, long)


async def _lag_during(read: asyncio.Future[Trajectory]) -> float:
    """The largest overshoot of a 5 ms sleep on this loop while ``read`` runs."""
    worst = 0.0
    while not read.done():
        t = time.perf_counter()
        await asyncio.sleep(0.005)
        worst = max(worst, time.perf_counter() - t - 0.005)
    return worst


async def test_a_30k_token_trajectory_reads_back_off_the_loop(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Three reads per attempt, the worst 5 ms-sleep overshoot of each attempt: one attempt of
    three must stay <= 50 ms (a burst of outside load on the shared cores spoils one attempt,
    a read that holds the loop long spoils all three). The read on the loop, once, for the
    message: ~12-50 ms here, by load."""
    journal = SqliteJournal(tmp_path / "j.db")
    renderer = Renderer(FastTokenizer(tiny_model_dir))
    turns = [p async for p in conversation(journal, renderer, turns=40, tool_chars=3200)]
    pid = turns[0][0].id
    attempts = []
    for _ in range(3):
        lags = []
        for _ in range(3):
            read = asyncio.ensure_future(journal.atrajectory(pid))
            lags.append(await _lag_during(read))
            traj = read.result()
        attempts.append(max(lags))
        if attempts[-1] <= 0.050:
            break
    t = time.perf_counter()
    on_loop = journal.trajectory(pid)  # the same read, holding the loop (for the message only)
    held_ms = 1000 * (time.perf_counter() - t)
    journal.close()
    assert traj.num_turns == 40 and len(traj.segments) == 1
    assert traj.turns[-1].total_tokens >= 30_000
    assert traj == on_loop
    worst = [round(1000 * x, 1) for x in attempts]
    assert min(attempts) <= 0.050, f"loop lag {worst} ms per attempt (the read on the loop: {held_ms:.0f} ms)"


def _turn(index: int, prompt: list[int], completion: list[int], lps: list[float]) -> Turn:
    return Turn(index=index, prompt_ids=prompt, completion_ids=completion, completion_logprobs=lps)


def _state(turn: Turn, segment: int, messages: list[Message]) -> ConversationState:
    returned = Message("assistant", f"answer {turn.index}")
    return ConversationState(
        messages, "[]", returned, turn.prompt_ids, turn.completion_ids, turn.index, segment
    )


# Two segments: turn 1 extends turn 0 (after an eos that closes it), turn 2 starts afresh. Ids past
# 16 bits and logprobs float32 cannot hold: each must come back exactly.
T0 = _turn(0, [1, 2, 3], [70_000, 5], [-0.1, -1 / 3])
T1 = _turn(1, [1, 2, 3, 70_000, 5, 0, 6, 7], [100_000, 9], [-0.25, -0.5]).model_copy(
    update={"forced": [(0, 2)]}  # sampled under a tool-call grammar: the flag comes back too
)
T2 = _turn(2, [9, 9], [4], [-0.75])
SEGMENTS = [0, 0, 1]
MESSAGES = [
    [Message("user", "hi")],
    [Message("user", "hi"), Message("assistant", "answer 0"), Message("user", "x" * 2000)],
    [Message("user", "summary")],
]


async def _record(journal: SqliteJournal, program: Program) -> None:
    for turn, seg, msgs in zip((T0, T1, T2), SEGMENTS, MESSAGES, strict=True):
        await journal.record_turn(program, turn, seg, [], _state(turn, seg, msgs))


async def test_turns_round_trip_exactly_and_store_only_their_new_ids(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.db")
    program = Program()
    journal.save_program(program)
    await _record(journal, program)
    traj = await journal.atrajectory(program.id)
    assert [s.turns for s in traj.segments] == [[T0, T1], [T2]]
    rows = journal._db.execute("SELECT reused, prompt_len FROM turns ORDER BY idx").fetchall()
    assert rows == [(0, 3), (5, 8), (0, 2)]  # turn 1 holds 3 ids of its 8: eos, 6, 7
    journal.close()
    again = SqliteJournal(tmp_path / "j.db")  # a restart: the state is rebuilt from the rows
    state = again.load_conversations()[program.id]
    assert (state.prompt_ids, state.completion_ids, state.segment) == (T2.prompt_ids, T2.completion_ids, 1)
    assert state.messages == MESSAGES[2]
    again.close()


async def test_a_turn_that_does_not_extend_its_segment_is_still_refused_on_read(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.db")
    program = Program()
    journal.save_program(program)
    await journal.record_turn(program, T0, 0, [], _state(T0, 0, MESSAGES[0]))
    edited = _turn(1, [1, 2, 4, 70_000, 5, 6], [7], [-0.5])  # same segment, prompt edited inside
    await journal.record_turn(program, edited, 0, [], _state(edited, 0, MESSAGES[1]))
    assert journal._db.execute("SELECT reused FROM turns WHERE idx = 1").fetchone() == (0,)  # stored whole
    with pytest.raises(ValidationError, match="does not extend"):
        journal.trajectory(program.id)
    journal.close()


async def test_a_turn_whose_commit_fails_is_not_what_the_next_one_is_stored_against(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.db")
    program = Program()
    journal.save_program(program)
    await journal.record_turn(program, T0, 0, [], _state(T0, 0, MESSAGES[0]))
    # refused (turn 0 again): its ids fit turn 1's prompt at every seam, 7 ids long where turn 0 has 5
    clash = _turn(0, [1, 2, 3, 70_000, 5, 0], [6], [-0.5])
    with pytest.raises(sqlite3.IntegrityError):
        await journal.record_turn(program, clash, 0, [], _state(clash, 0, MESSAGES[0]))
    await journal.record_turn(program, T1, 0, [], _state(T1, 0, MESSAGES[1]))
    assert (await journal.atrajectory(program.id)).segments == [Segment(turns=[T0, T1])]
    journal.close()


@pytest.mark.parametrize(
    "values, pack, width",
    [
        ([0, 65_535], pack_ids, 2),
        ([0, 65_536], pack_ids, 4),
        ([0, 2**40], pack_ids, 8),
        ([-0.25, -1.5], pack_logprobs, 4),  # fp32 values: 4 bytes each
        ([-0.1, -1 / 3], pack_logprobs, 8),  # not fp32 values: kept as they were
    ],
)
def test_blobs_take_the_narrowest_exact_type(values: list, pack: Any, width: int) -> None:
    blob = pack(values)
    assert len(blob) == 1 + width * len(values)
    assert unpack(blob) == values


def _v1_journal(path: Path, program: Program, *, bad_turn: bool = False) -> None:
    """A journal as schema 1 wrote it: whole turns as JSON, the whole conversation state."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(SCHEMA_V1)
    db.execute("INSERT INTO programs (id, body) VALUES (?, ?)", (program.id, program.model_dump_json()))
    for turn, seg in zip((T0, T1, T2), SEGMENTS, strict=True):
        body = "{not json" if bad_turn and turn is T2 else turn.model_dump_json()
        db.execute("INSERT INTO turns VALUES (?, ?, ?, ?)", (program.id, turn.index, seg, body))
    db.execute(
        "INSERT INTO events (program_id, body) VALUES (?, ?)", (program.id, '{"kind": "note", "data": {}}')
    )
    state = _state(T2, 1, MESSAGES[2]).to_json()
    db.execute("INSERT INTO conversations VALUES (?, ?)", (program.id, json.dumps(state)))
    db.close()


async def test_a_schema_1_journal_is_migrated_on_open(tmp_path: Path) -> None:
    path, program = tmp_path / "old.db", Program()
    _v1_journal(path, program)
    journal = SqliteJournal(path)
    assert journal._db.execute("PRAGMA user_version").fetchone() == (2,)
    tables = {r[0] for r in journal._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not {"turns_v1", "conversations_v1"} & tables
    traj = journal.trajectory(program.id)
    assert traj.segments == [Segment(turns=[T0, T1]), Segment(turns=[T2])]
    assert journal._db.execute("SELECT reused FROM turns ORDER BY idx").fetchall() == [(0,), (5,), (0,)]
    state = journal.load_conversations()[program.id]
    assert state.prompt_ids == T2.prompt_ids and state.messages == MESSAGES[2]
    t3 = _turn(3, [9, 9, 4, 8], [1], [-0.5])  # the program goes on, extending the migrated turn
    await journal.record_turn(program, t3, 1, [], _state(t3, 1, [*MESSAGES[2], Message("user", "go")]))
    assert (await journal.atrajectory(program.id)).segments[1].turns == [T2, t3]
    journal.close()


def test_a_migration_that_fails_leaves_the_old_journal_as_it_was(tmp_path: Path) -> None:
    path, program = tmp_path / "old.db", Program()
    _v1_journal(path, program, bad_turn=True)
    with pytest.raises(ValidationError):
        SqliteJournal(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (3,)
    assert "body" in {r[1] for r in db.execute("PRAGMA table_info(turns)")}
    db.close()


def test_a_journal_from_a_newer_rollyard_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 3")
    db.close()
    with pytest.raises(ConfigError, match="newer rollyard"):
        SqliteJournal(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (3,)
    assert db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone() == (0,)
    db.close()


def test_the_export_of_a_migrated_journal_is_the_export_of_the_same_turns(tmp_path: Path) -> None:
    """``rollyard export`` (``export_group``) reads rebuilt prompts: the Parquet rows of a schema-1
    journal, once migrated, are those of the same turns recorded now."""
    from rollyard.core.tables import read_parquet
    from rollyard.gateway.serve import export_group

    program = Program()
    _v1_journal(tmp_path / "old.db", program)
    recorded = SqliteJournal(tmp_path / "new.db")
    recorded.save_program(program)
    asyncio.run(_record(recorded, program))
    recorded.record_events(program.id, [])
    recorded.close()
    assert export_group(tmp_path / "old.db", None, tmp_path / "old.parquet") == 1
    assert export_group(tmp_path / "new.db", None, tmp_path / "new.parquet") == 1
    (old,), (new,) = read_parquet(tmp_path / "old.parquet"), read_parquet(tmp_path / "new.parquet")
    assert old.segments == new.segments  # (Parquet keeps logprobs as float32, both alike)
    assert [t.prompt_ids for t in new.turns] == [T0.prompt_ids, T1.prompt_ids, T2.prompt_ids]
