"""One program's failing requests stay with it: the engine stays up, others are served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rollyard.core.errors import EngineError, InvalidRequest
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend, new_program

CHAT = "/v1/chat/completions"
HI = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def guarded(engine: ScriptedBackend, tok: FastTokenizer, tmp_path: Path) -> Iterator[TestClient]:
    gw = build_gateway({"fake": engine}, tok, tmp_path / "journal.db", ADMIN, "tiny")
    limits = GatewayLimits(error_budget=3, error_window_s=60, error_cooldown_s=60, breaker_base_s=2.0)
    with TestClient(create_app(gw, poll_interval_s=0.05, limits=limits)) as c:
        yield c


def chat(c: TestClient, key: str, body: dict = HI) -> tuple[int, dict, dict]:
    r = c.post(CHAT, json=body, headers={"x-api-key": key})
    return r.status_code, r.json(), dict(r.headers)


def metric(c: TestClient, name: str) -> float:
    text = c.get("/metrics", headers={"x-api-key": ADMIN}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_an_engine_error_answering_one_request_stays_with_that_request(
    guarded: TestClient, engine: ScriptedBackend
) -> None:
    a, b = new_program(guarded)["api_key"], new_program(guarded)["api_key"]
    engine.errors = [EngineError("engine fake failed on this request (500)")]
    status, err, _ = chat(guarded, a)
    assert status == 502 and err["error"]["code"] == "engine_error"
    # The engine was not marked down: the next program is served at once, health stays ok.
    assert guarded.get("/health").json()["status"] == "ok"
    assert chat(guarded, b)[0] == 200
    assert metric(guarded, 'rollyard_engine_breaker_opens_total{engine="fake"}') == 0


def test_a_program_whose_requests_keep_failing_is_throttled_and_others_are_not(
    guarded: TestClient, engine: ScriptedBackend
) -> None:
    bad, good = new_program(guarded)["api_key"], new_program(guarded)["api_key"]
    engine.errors = [InvalidRequest("engine rejected the request"), EngineError("boom")]
    assert chat(guarded, bad)[0] == 400
    assert chat(guarded, bad)[0] == 502
    assert chat(guarded, bad, {"messages": [{"role": "user", "content": 5}]})[0] == 400  # 3rd: spent
    status, err, headers = chat(guarded, bad)
    assert status == 429 and err["error"]["type"] == "rate_limit_error"
    assert int(headers["retry-after"]) >= 1
    assert chat(guarded, good)[0] == 200
    assert metric(guarded, "rollyard_gateway_programs_throttled_total") == 1
    assert metric(guarded, 'rollyard_gateway_request_errors_total{cause="request"}') == 3


def test_a_dead_engine_is_held_out_by_its_breaker_then_comes_back(
    guarded: TestClient, engine: ScriptedBackend
) -> None:
    key = new_program(guarded)["api_key"]
    engine.down = True
    status, err, _ = chat(guarded, key)
    assert status == 503 and err["error"]["code"] == "engine_unavailable"
    engine.down = False
    # Up again, but the breaker holds it out for its backoff (the poller cannot bring it back).
    assert guarded.get("/health").json()["status"] == "degraded"
    assert metric(guarded, 'rollyard_engine_breaker_open{engine="fake"}') == 1
    deadline = time.monotonic() + 10
    while guarded.get("/health").json()["status"] != "ok" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chat(guarded, key)[0] == 200
    assert metric(guarded, 'rollyard_engine_breaker_open{engine="fake"}') == 0
    assert metric(guarded, 'rollyard_engine_breaker_opens_total{engine="fake"}') >= 1


def test_a_finished_programs_state_is_freed_from_memory(guarded: TestClient) -> None:
    gw = guarded.app.state.gateway  # type: ignore[attr-defined]
    progs = [new_program(guarded) for _ in range(5)]
    for p in progs:
        assert chat(guarded, p["api_key"])[0] == 200
    assert {p["id"] for p in progs} <= set(gw.conversations)
    for p in progs[:4]:
        r = guarded.post(
            f"/programs/{p['id']}/finish", json={"status": "success"}, headers={"x-api-key": ADMIN}
        )
        assert r.status_code == 200
    assert set(gw.conversations) == {progs[4]["id"]} and set(gw._locks) == {progs[4]["id"]}
    # The journal still has every finished program's turns.
    r = guarded.get(f"/programs/{progs[0]['id']}/trajectory", headers={"x-api-key": ADMIN})
    assert sum(len(s["turns"]) for s in r.json()["segments"]) == 1
