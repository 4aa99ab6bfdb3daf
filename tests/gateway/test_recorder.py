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
        msgs.append(api.chat.completions.create(model="tiny", messages=msgs).choices[0].message.model_dump())
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    msgs.append({"role": "user", "content": "again"})
    with TestClient(create_app(build_gateway({"e": engine}, tok, db, ADMIN, "tiny"))) as c:
        api = openai.OpenAI(base_url="http://testserver/v1", api_key=prog["api_key"], http_client=c)
        api.chat.completions.create(model="tiny", messages=msgs)
        body = c.get(f"/programs/{prog['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
    traj = Trajectory.model_validate(body)
    assert traj.num_turns == 2 and len(traj.segments) == 1
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]


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
