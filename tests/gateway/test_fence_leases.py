"""Version fences leased to another process (the trainer of a ``rollyard train`` run) through the
admin API: requests wait while the fence is held and go under the version the trainer names;
a failed update or a lapsed lease holds the engine out; only the admin token, never on the
sandboxes' socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rollyard.core.errors import Conflict
from rollyard.engines.fence import VersionFence
from rollyard.gateway.app import build_gateway, create_app
from rollyard.gateway.fence_leases import FenceLeases
from rollyard.gateway.tokenizer import FastTokenizer

from .conftest import ScriptedBackend

ADMIN = "fence-admin"


class FencedBackend(ScriptedBackend, VersionFence):
    """The scripted engine with the real fence; its engine calls (/pause ...) are recorded."""

    def __init__(self, tok: FastTokenizer) -> None:
        ScriptedBackend.__init__(self, tok, name="e0")
        VersionFence.__init__(self)
        self._version = 0
        self.calls: list[str] = []

    @property
    def policy_version(self) -> int:
        return self._version

    async def _request(self, method: str, path: str, **kw: Any) -> tuple[int, bytes]:
        self.calls.append(path)
        return 200, b""

    async def reset_prefix_cache(self) -> None:
        self.calls.append("/reset_prefix_cache")

    async def resume(self) -> None:
        self.calls.append("/resume")

    def serving(self, version: int) -> None:
        self._version = version


async def test_a_lease_holds_requests_until_the_trainer_names_the_new_version(tok: FastTokenizer) -> None:
    engine, leases = FencedBackend(tok), FenceLeases()
    assert 0.0 <= await leases.enter(engine) < 1.0  # nothing in flight to drain
    assert engine.calls == ["/pause"]
    admitted = asyncio.create_task(engine._admit())  # a request arriving during the update
    await asyncio.sleep(0.05)
    assert not admitted.done()
    with pytest.raises(Conflict, match="fenced already"):
        await leases.enter(engine)
    await leases.leave("e0", 4, None)
    assert await admitted == 4  # stamped with the version that will generate it
    assert engine.calls == ["/pause", "/reset_prefix_cache", "/resume"] and engine.held is None
    with pytest.raises(Conflict, match="not fenced"):
        await leases.leave("e0", 5, None)


async def test_a_failed_update_or_a_lapsed_lease_holds_the_engine_out(tok: FastTokenizer) -> None:
    engine, leases = FencedBackend(tok), FenceLeases()
    await leases.enter(engine)
    await leases.leave("e0", 1, "the gloo link broke")
    assert engine.held is not None and "gloo link broke" in engine.held
    assert engine.policy_version == 0 and engine.calls[-1] == "/resume"
    engine.release()
    await leases.enter(engine, lease_s=0.1)  # the trainer dies holding it
    await asyncio.sleep(0.5)
    assert engine.held is not None and "lease ran out" in engine.held and engine.policy_version == 0


def test_the_routes_take_the_admin_token_and_report_versions(tok: FastTokenizer, tmp_path: Path) -> None:
    engine = FencedBackend(tok)
    gw = build_gateway({"e0": engine}, tok, tmp_path / "j.db", ADMIN, "tiny")
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app(gw)) as client:
        made = client.post("/programs", json={}, headers=auth).json()
        key = {"Authorization": f"Bearer {made['api_key']}"}
        assert client.post("/engines/e0/fence", json={}, headers=key).status_code in (401, 403)
        assert client.post("/engines/e9/fence", json={}, headers=auth).status_code == 404
        assert client.post("/engines/e0/fence", json={}, headers=auth).json()["drained_s"] < 1.0
        left = client.post("/engines/e0/fence/leave", json={"version": 2}, headers=auth).json()
        assert left == {"name": "e0", "version": 2, "held": None}
        assert client.post("/engines/e0/hold", json={"why": "restarting"}, headers=auth).status_code == 200
        assert client.post("/engines/e0/serving", json={"version": 3}, headers=auth).status_code == 200
        rows = client.get("/engines", headers=auth).json()
        assert rows["data"] == [{"name": "e0", "version": 3, "held": "restarting", "healthy": True}]
        assert set(rows["counts"]) >= {"pauses", "restores", "moves"} and rows["loop_lag_max_ms"] >= 0
        assert client.post("/engines/e0/release", headers=auth).json()["held"] is None
        bad = client.post("/engines/e0/fence/leave", json={"version": "x"}, headers=auth)
        assert bad.status_code == 400


async def test_a_fence_refused_by_one_shard_is_left_at_once_by_the_others(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    """The run fences an engine in every gateway shard; when one refuses, the shards that did fence
    are told it failed (the engine held out there) instead of holding it until their lease ends."""
    from rollyard.core.errors import Conflict as Refused
    from rollyard.rollout.gateway_client import GatewayClient

    from .conftest import serving

    engines = [FencedBackend(tok), FencedBackend(tok)]
    apps = [
        create_app(build_gateway({"e0": e}, tok, tmp_path / f"j{k}.db", ADMIN, "tiny"))
        for k, e in enumerate(engines)
    ]
    with serving(apps[0]) as url0, serving(apps[1]) as url1:
        await apps[1].state.fence_leases.enter(engines[1])  # shard 1's engine is fenced already
        client = GatewayClient([url0, url1], ADMIN)
        try:
            with pytest.raises(Refused, match="fenced already"):
                await client.enter_fence("e0")
        finally:
            await client.aclose()
        assert engines[0]._fence is None  # shard 0 let go at once
        assert engines[0].held is not None and "another gateway shard" in engines[0].held
        await apps[1].state.fence_leases.leave("e0", 0, None)
