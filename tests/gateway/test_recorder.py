"""Journal: a restart reloads programs and conversation state, and agents continue in the same segment."""

from __future__ import annotations

import stat
from pathlib import Path

import openai
from fastapi.testclient import TestClient

from rollyard.core.trajectory import Trajectory
from rollyard.gateway import SqliteJournal, build_gateway, create_app

from .conftest import ADMIN, ScriptedBackend, new_program


def test_restart_reloads_programs_and_continues_the_segment(tok, tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    engine = ScriptedBackend(tok)
    msgs: list[dict] = [{"role": "user", "content": "hi"}]
    with TestClient(create_app(build_gateway({"e": engine}, tok, db, ADMIN, "tiny"))) as c:
        prog = new_program(c)
        api = openai.OpenAI(base_url="http://testserver/v1", api_key=prog["api_key"], http_client=c)
        for text in ("one", "two"):  # the state reloaded is the second turn's, not the first's
            msgs.append(
                api.chat.completions.create(model="tiny", messages=msgs).choices[0].message.model_dump()
            )
            msgs.append({"role": "user", "content": text})
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    with TestClient(create_app(build_gateway({"e": engine}, tok, db, ADMIN, "tiny"))) as c:
        api = openai.OpenAI(base_url="http://testserver/v1", api_key=prog["api_key"], http_client=c)
        api.chat.completions.create(model="tiny", messages=msgs)
        body = c.get(f"/programs/{prog['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
    traj = Trajectory.model_validate(body)
    assert traj.num_turns == 3 and len(traj.segments) == 1
    second = traj.segments[0].turns[1]
    assert engine.prompts[2][: len(second.prompt_ids)] == second.prompt_ids == engine.prompts[1]
    assert engine.prompts[2][len(second.prompt_ids) :][: len(second.completion_ids)] == second.completion_ids


def test_a_conversation_whose_turn_row_is_gone_is_not_reloaded(tok, tmp_path: Path) -> None:
    """A damaged journal must not hand the next turn guessed ids: it renders afresh instead."""
    db = tmp_path / "j.db"
    engine = ScriptedBackend(tok)
    msgs: list[dict] = [{"role": "user", "content": "hi"}]
    with TestClient(create_app(build_gateway({"e": engine}, tok, db, ADMIN, "tiny"))) as c:
        prog = new_program(c)
        api = openai.OpenAI(base_url="http://testserver/v1", api_key=prog["api_key"], http_client=c)
        msgs.append(api.chat.completions.create(model="tiny", messages=msgs).choices[0].message.model_dump())
    journal = SqliteJournal(db)
    assert set(journal.load_conversations()) == {prog["id"]}
    assert journal.load_conversations(only=set()) == {}  # finished programs' states are not read
    journal._db.execute("DELETE FROM turns")
    assert journal.load_conversations() == {}
    journal.close()


async def test_group_commit_keeps_order_and_outlives_a_cancelled_waiter(tmp_path: Path) -> None:
    import asyncio

    from rollyard.core.program import Program

    journal = SqliteJournal(tmp_path / "j.db")
    prog = Program()
    journal.save_program(prog)
    sql = "INSERT INTO events (program_id, body) VALUES (?, ?)"
    waiters = [asyncio.ensure_future(journal.commit([(sql, (prog.id, f"e{i}"))])) for i in range(5)]
    await asyncio.sleep(0)  # all five are queued for the same commit
    waiters[2].cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    rows = journal._db.execute("SELECT body FROM events WHERE program_id = ? ORDER BY seq", (prog.id,))
    assert [r[0] for r in rows] == [f"e{i}" for i in range(5)]
    journal.close()


ROW = "INSERT INTO events (program_id, body) VALUES (?, ?)"


async def _write(journal: SqliteJournal, program_id: str, n: int, size: int = 4000) -> None:
    for i in range(n):
        await journal.commit([(ROW, (program_id, f"{i:06d}" + "x" * size))])


async def test_checkpoints_run_on_their_own_thread_and_keep_the_wal_small(tmp_path: Path) -> None:
    """The loop's connection never checkpoints (without the thread the WAL holds every row and
    the database none); with it, the database holds the rows, the WAL stays near the
    threshold, and commits queued during a checkpoint all land, in order."""
    import threading

    from rollyard.core.program import Program

    prog = Program()
    off = SqliteJournal(tmp_path / "off.db", checkpoint_bytes=1 << 40)
    off.save_program(prog)
    await _write(off, prog.id, 500)  # 2 MB of rows
    assert off._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    assert (tmp_path / "off.db").stat().st_size < 100_000
    assert (tmp_path / "off.db-wal").stat().st_size > 2_000_000
    off.close()

    on = SqliteJournal(tmp_path / "on.db", checkpoint_bytes=64 * 1024)
    on.save_program(prog)
    await _write(on, prog.id, 500)
    assert on.checkpoints >= 10
    assert any(t.name.startswith("journal-checkpoint") for t in threading.enumerate())
    assert (tmp_path / "on.db").stat().st_size > 2_000_000
    assert (tmp_path / "on.db-wal").stat().st_size < 1_000_000
    rows = on._db.execute(
        "SELECT substr(body, 1, 6) FROM events WHERE program_id = ? ORDER BY seq", (prog.id,)
    )
    assert [int(r[0]) for r in rows] == list(range(500))
    on.close()


_CRASH = r"""
import asyncio, os, signal, sys
sys.path.insert(0, sys.argv[2])
from rollyard.core.program import Program
from rollyard.gateway.recorder import SqliteJournal

async def main() -> None:
    j = SqliteJournal(sys.argv[1], checkpoint_bytes=32 * 1024)
    prog = Program()
    j.save_program(prog)
    sql = "INSERT INTO events (program_id, body) VALUES (?, ?)"
    for i in range(100_000):
        await j.commit([(sql, (prog.id, f"{i:06d}" + "x" * 4000))])
        print(i, flush=True)  # acknowledged
        if j.checkpoints >= 5 and j._checkpointing:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-checkpoint, turns queued behind it

asyncio.run(main())
"""


def test_kill_9_during_a_background_checkpoint_loses_no_acknowledged_row(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    import rollyard

    src = str(Path(rollyard.__file__).parents[1])
    db = tmp_path / "j.db"
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH, str(db), src], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acked = int(proc.stdout.split()[-1])
    journal = SqliteJournal(db)
    try:
        assert journal._db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = [int(r[0]) for r in journal._db.execute("SELECT substr(body, 1, 6) FROM events ORDER BY seq")]
        assert rows[: acked + 1] == list(range(acked + 1)) and len(rows) <= acked + 2
    finally:
        journal.close()
