"""Engines rollyard starts answer nothing without the engine key: not the model routes, not
``/metrics``, and not vLLM's dev-mode routes (``/pause``, ``/collective_rpc``) that its own
``--api-key`` leaves open."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from rollyard.core.engine_key import KEY_ENV, KEY_FILE_ENV, engine_headers, engine_key
from rollyard.engines.access import RequireEngineKey


def test_the_key_is_made_once_private_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "cfg" / "engine.key"))
    first = engine_key()
    assert len(first) >= 32 and engine_key() == first
    assert stat.S_IMODE(os.stat(tmp_path / "cfg" / "engine.key").st_mode) == 0o600
    assert [p.name for p in (tmp_path / "cfg").iterdir()] == ["engine.key"]  # no temp file left
    monkeypatch.setenv(KEY_ENV, "from-env")
    assert engine_headers() == {"Authorization": "Bearer from-env"}


@pytest.mark.parametrize("key", ["k1", None])
def test_the_middleware_refuses_every_route_without_the_key(
    key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if key is None:
        monkeypatch.delenv(KEY_ENV, raising=False)  # no key configured: everything is refused
    else:
        monkeypatch.setenv(KEY_ENV, key)
    app = Starlette(routes=[Route(p, lambda r: PlainTextResponse("ok"), methods=["GET", "POST"])
                            for p in ("/health", "/pause", "/v1/models")])  # fmt: skip
    app.add_middleware(RequireEngineKey)
    with TestClient(app) as c:
        for path in ("/health", "/pause", "/v1/models"):
            assert c.post(path).status_code == 401
            assert c.post(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.post(path, headers={"Authorization": "Basic k1"}).status_code == 401
            ok = c.post(path, headers={"Authorization": "Bearer k1"}).status_code
            assert ok == (200 if key else 401)


@pytest.mark.engine
def test_a_started_engine_answers_nothing_without_the_key(vllm_url: str) -> None:
    if os.environ.get("ROLLYARD_TEST_ENGINE_URL"):
        pytest.skip("an engine started by hand may run without rollyard's middleware")
    calls = [
        ("POST", "/pause", {"params": {"mode": "keep"}}),
        ("POST", "/collective_rpc", {"json": {"method": "reload_weights", "kwargs": {"weights_path": "/"}}}),
        ("POST", "/reset_prefix_cache", {}),
        ("GET", "/metrics", {}),
        ("GET", "/v1/models", {}),
        ("GET", "/health", {}),
    ]
    for method, path, kw in calls:
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            r = httpx.request(method, vllm_url + path, headers=headers, timeout=30, **kw)
            assert r.status_code == 401, (path, r.status_code, r.text)
    with httpx.Client(base_url=vllm_url, headers=engine_headers(), timeout=30) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        assert c.get("/metrics").status_code == 200
        assert c.post("/reset_prefix_cache").status_code == 200  # a dev route, with the key
