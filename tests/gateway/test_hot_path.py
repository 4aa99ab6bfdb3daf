"""The model endpoints' short way in: the same routes, the same answers as the full stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.gateway.conftest import ADMIN, ScriptedBackend, new_program

from rollyard.gateway import build_gateway, create_app
from rollyard.gateway.hot_path import GatewayApp
from rollyard.gateway.model_route import ModelRoute, body_model
from rollyard.gateway.tokenizer import FastTokenizer


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths that took the short way."""
    paths: list[str] = []
    serve = GatewayApp._serve

    async def spy(self: GatewayApp, handler: Any, scope: Any, receive: Any, send: Any) -> None:
        paths.append(scope["path"])
        await serve(self, handler, scope, receive, send)

    monkeypatch.setattr(GatewayApp, "_serve", spy)
    return paths


def test_every_lean_model_endpoint_and_nothing_else_is_on_the_short_way(client: TestClient) -> None:
    app = client.app
    assert isinstance(app, GatewayApp)
    table = app._hot_table()
    lean = [
        r.path
        for r in app.routes
        if isinstance(r, ModelRoute) and "POST" in r.methods and body_model(r.endpoint) is not None
    ]
    assert sorted(table) == sorted(lean)
    assert len(table) == 5 * 6  # chat, responses, messages, count_tokens, completions under 6 prefixes
    assert not any(p.startswith("/programs") for p in table)


def _chunked(body: bytes) -> Iterator[bytes]:
    """A body without ``Content-Length``: it goes through the whole stack (``BodyLimit`` counts it)."""
    yield body


HI = b'[{"role": "user", "content": "hi"}]'
CASES = [
    # path, body, key: each API's own error bodies, auth, a program-id prefix, a good request
    ("/v1/chat/completions", b"{not json", True),
    ("/v1/chat/completions", b'{"messages": "x"}', True),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', False),
    ("/v1/messages", b'{"max_tokens": 4}', True),
    ("/v1/messages", b"[1,", True),
    ("/p/..bad/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', True),
    ("/p/nosuch/v1/messages", b'{"model": "t", "max_tokens": 4, "messages": []}', True),
    ("/v1/responses", b'{"input": 3}', True),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}', True),
    ("/v1/messages", b'{"model": "t", "max_tokens": 4, "messages": ' + HI + b"}", True),
]


def _comparable(r: Any) -> tuple[int, Any]:
    body = r.json()
    if r.status_code == 200:  # ids and timings differ from call to call
        return 200, sorted(body)
    return r.status_code, body


@pytest.mark.parametrize(("path", "body", "keyed"), CASES)
def test_the_short_way_answers_as_the_stack_does(
    client: TestClient, served: list[str], path: str, body: bytes, keyed: bool
) -> None:
    p = new_program(client)
    headers = {"Authorization": f"Bearer {p['api_key']}"} if keyed else {}
    headers["content-type"] = "application/json"
    short = client.post(path, content=body, headers=headers)
    assert served == [path]
    stack = client.post(path, content=_chunked(body), headers=headers)
    assert served == [path]
    assert _comparable(short) == _comparable(stack)


def test_a_declared_body_over_the_limit_takes_the_stack_and_gets_its_413(
    client: TestClient, served: list[str]
) -> None:
    big = b'{"messages": [], "x": "' + b"a" * (9 << 20) + b'"}'
    r = client.post("/v1/messages", content=big, headers={"x-api-key": "k"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert served == []


def test_an_unexpected_error_is_a_500_and_goes_on_to_the_server(
    engine: ScriptedBackend, tok: FastTokenizer, tmp_path: Path, served: list[str]
) -> None:
    async def broken(*_: object, **__: object) -> None:
        raise ZeroDivisionError("a bug")

    body = {"messages": [{"role": "user", "content": "hi"}]}
    for raising in (False, True):
        gw = build_gateway({"fake": engine}, tok, tmp_path / f"{raising}.db", ADMIN, "tiny")
        gw.chat = broken  # type: ignore[method-assign]
        with TestClient(create_app(gw, poll_interval_s=0.05), raise_server_exceptions=raising) as c:
            key = new_program(c)["api_key"]
            if raising:  # the server sees it (and logs it)
                with pytest.raises(ZeroDivisionError):
                    c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                continue
            r = c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        assert "a bug" not in r.text
    assert served == ["/v1/chat/completions"] * 2
