"""Programs that never finish are terminated after the idle TTL and their state freed."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from rollyard.core.clock import FakeClock
from rollyard.core.program import Program, ProgramState
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.idle import IDLE_STATUS, IdlePrograms, reap_idle
from rollyard.gateway.programs import ProgramTable
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend, new_program


def test_only_programs_idle_past_the_ttl_and_not_busy_are_ended(tmp_path: Path) -> None:
    clock = FakeClock()
    programs = ProgramTable(SqliteJournal(tmp_path / "j.db"), clock, ADMIN)
    idle = IdlePrograms(clock, ttl_s=60.0)
    programs.on_create(lambda p: idle.touch(p.id))
    programs.on_terminate(lambda p: idle.forget(p.id))
    a, b, c = (programs.create(Program(id=x)) for x in "abc")
    clock.advance(50.0)
    idle.touch("a")  # a request of a
    clock.advance(20.0)  # b and c: idle 70 s; a: 20 s
    assert idle.expired() == ["b", "c"]
    assert reap_idle(idle, programs, busy=lambda pid: pid == "c") == ["b"]  # c has a request in flight
    assert b.state is ProgramState.TERMINATED and b.status == IDLE_STATUS
    assert a.state is ProgramState.ACTIVE and c.state is ProgramState.ACTIVE
    assert idle.expired() == [] and len(idle) == 2  # c was touched: a full TTL again
    clock.advance(61.0)
    assert reap_idle(idle, programs, busy=lambda pid: False) == ["a", "c"] and len(idle) == 0


def test_a_ttl_of_zero_never_ends_anything() -> None:
    clock = FakeClock()
    idle = IdlePrograms(clock, ttl_s=0)
    idle.touch("a")
    clock.advance(1e9)
    assert idle.expired() == []


def test_the_gateway_ends_an_idle_program_frees_its_state_and_refuses_it_after(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    # The TTL is several times the busy program's gap between requests (0.1 s sleep): at 0.6 s a
    # loaded CI machine once stalled the client past it and the busy program was ended too.
    limits = GatewayLimits(program_idle_ttl_s=1.5)
    with TestClient(create_app(gw, poll_interval_s=0.05, limits=limits)) as c:
        busy, quiet = new_program(c), new_program(c)
        hi = {"messages": [{"role": "user", "content": "hi"}]}
        for p in (busy, quiet):
            assert (
                c.post("/v1/chat/completions", json=hi, headers={"x-api-key": p["api_key"]}).status_code
                == 200
            )
        assert quiet["id"] in gw.conversations
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:  # the busy one keeps talking; the quiet one does not
            r = c.post("/v1/chat/completions", json=hi, headers={"x-api-key": busy["api_key"]})
            assert r.status_code == 200, r.text
            time.sleep(0.1)
        q = c.get(f"/programs/{quiet['id']}", headers={"x-api-key": ADMIN}).json()
        assert q["state"] == "terminated" and q["status"] == IDLE_STATUS
        assert quiet["id"] not in gw.conversations and busy["id"] in gw.conversations
        r = c.post("/v1/chat/completions", json=hi, headers={"x-api-key": quiet["api_key"]})
        assert r.status_code == 409, r.text
        text = c.get("/metrics", headers={"x-api-key": ADMIN}).text
        assert "rollyard_gateway_programs_idle_ended_total 1.0" in text
        # Its turn is still in the journal.
        traj = c.get(f"/programs/{quiet['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
        assert sum(len(s["turns"]) for s in traj["segments"]) == 1
