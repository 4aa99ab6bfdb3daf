"""Hostile bodies against the real app over real HTTP (scripted engine): never a 5xx.

Valid requests of each API are mutated at every path (a value of another JSON type, a
deleted or unknown key, deep nesting, a large string) and at the byte level (invalid UTF-8,
lone UTF-16 surrogate escapes, NaN). Every answer must be < 500 with no traceback in it, the
next request on the same keep-alive connection must succeed, and the app must be healthy after.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend, serving

CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "src"}'}}
FN = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
SEEDS: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "list src"}]},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            ],
            "tools": [FN],
            "tool_choice": "auto",
            "max_tokens": 8,
            "temperature": 0.5,
            "stream": False,
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "tools": [FN],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ],
    "/v1/messages": [
        {
            "model": "tiny",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "list src"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": ""},
                        {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "src"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"}],
                },
            ],
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
            "stream": True,
        },
    ],
    "/v1/responses": [
        {
            "model": "tiny",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "list src"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
            ],
            "tools": [{"type": "function", "name": "ls", "parameters": {}}, {"type": "web_search"}],
            "tool_choice": "auto",
            "max_output_tokens": 8,
            "stream": False,
        },
        {
            "input": "hi",
            "stream": True,
            "tools": [{"type": "function", "name": "ls"}],
            "tool_choice": {"type": "function", "name": "ls"},
        },
    ],
    "/v1/completions": [{"prompt": "hello", "max_tokens": 4}, {"prompt": [1, 2, 3], "max_tokens": 4}],
}

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ODD = st.sampled_from(
    [
        "x" * 200_000,
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        {"type": "text"},
        {"type": ["text"]},
        {"role": {"x": 1}},
        "function",
        -1,
        2**64,
        1e308,
        "",
        [],
        {},
    ]
)


def paths(obj: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*here, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*here, i))
    return out


def mutate(body: dict[str, Any], path: tuple[Any, ...], kind: str, value: Any) -> Any:
    body = copy.deepcopy(body)
    if not path:
        return value if kind == "replace" else body
    parent = body
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if kind == "replace":
        parent[last] = value
    elif kind == "delete":
        del parent[last]
    elif kind == "wrap":
        parent[last] = [parent[last]]
    elif kind == "unknown" and isinstance(parent, dict):
        parent[f"zz_{len(str(value))}"] = value
    return body


RAW = [
    b'"\\ud800"',  # a lone surrogate escape
    b'"\\udc00x"',
    b'"\xff\xfe"',  # invalid UTF-8
    b"NaN",
    b"Infinity",
    b'"\xed\xa0\x80"',  # a surrogate encoded as UTF-8
]


@pytest.fixture(scope="module")
def server(tok: FastTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gw = build_gateway(
        {"fake": ScriptedBackend(tok)}, tok, tmp_path_factory.mktemp("fz") / "j.db", ADMIN, "tiny"
    )
    limits = GatewayLimits(max_body_bytes=1_000_000, error_budget=0)
    with serving(create_app(gw, poll_interval_s=0.2, limits=limits)) as url:
        yield url


@pytest.fixture(scope="module")
def http(server: str) -> Iterator[httpx.Client]:
    key = httpx.post(f"{server}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)  # one keep-alive connection
    with httpx.Client(base_url=server, headers={"x-api-key": key}, limits=limits, timeout=30) as c:
        yield c


def check(http: httpx.Client, path: str, content: bytes) -> None:
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    text = r.text
    assert r.status_code < 500, (r.status_code, text[:500], content[:300])
    assert "Traceback" not in text and "internal gateway error" not in text, text[:500]
    # The same keep-alive connection still serves the next request.
    assert http.get("/health").status_code == 200


ROUTES = sorted(SEEDS)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(ROUTES),
    data=st.data(),
    kind=st.sampled_from(["replace", "replace", "delete", "wrap", "unknown"]),
    value=JSON | ODD,
)
def test_mutated_bodies_never_get_a_5xx(
    http: httpx.Client, route: str, data: st.DataObject, kind: str, value: Any
) -> None:
    body = data.draw(st.sampled_from(SEEDS[route]))
    path = data.draw(st.sampled_from(paths(body)))
    check(http, route, json.dumps(mutate(body, path, kind, value)).encode())


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), data=st.data(), raw=st.sampled_from(RAW))
def test_invalid_unicode_anywhere_is_a_400(
    http: httpx.Client, route: str, data: st.DataObject, raw: bytes
) -> None:
    body = data.draw(st.sampled_from(SEEDS[route]))
    text = json.dumps(body).encode()
    # Put the raw value in place of one string (a key or a value).
    at, end = data.draw(st.sampled_from([m.span() for m in re.finditer(rb'"(?:[^"\\]|\\.)*"', text)]))
    r = http.post(route, content=text[:at] + raw + text[end:], headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert "Traceback" not in r.text
    assert http.get("/health").status_code == 200


def test_valid_seeds_are_accepted(http: httpx.Client) -> None:
    """The fuzz starts from bodies the gateway serves (else it would only test rejection)."""
    for route, bodies in SEEDS.items():
        for body in bodies:
            r = http.post(route, json=body)
            assert r.status_code == 200, (route, r.text[:300])


def test_oversized_body_is_413_in_the_dialect_and_app_stays_healthy(http: httpx.Client, server: str) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode()
    r = http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = http.post("/v1/messages", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    with httpx.Client(base_url=server, headers=dict(http.headers)) as c:
        r = c.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:200]
    assert http.get("/health").json()["status"] == "ok"


def test_an_endless_chunked_upload_is_refused_and_cut_off(http: httpx.Client, server: str) -> None:
    """Once over the limit the gateway answers 413 and closes: it does not read on forever."""
    host, port = server.removeprefix("http://").split(":")
    key = http.headers["x-api-key"]
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\nx-api-key: {key}\r\n"
        "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    sent, answer = 0, b""
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            while sent < 100_000_000:  # 100x the limit: the gateway must stop it long before
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset or broken pipe: the gateway closed the connection
            pass
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                answer += data
    assert sent < 20_000_000, sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert http.get("/health").json()["status"] == "ok"


def test_unknown_fields_are_recorded_by_name_only_and_bounded(http: httpx.Client, server: str) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stop": ["x" * 5000]}
    body.update({f"k{i}": "v" * 100 for i in range(5000)})
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text[:300]
    pid = next(p["id"] for p in httpx.get(f"{server}/programs", headers={"x-api-key": ADMIN}).json()["data"])
    traj = httpx.get(f"{server}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN}).json()
    ignored = [e for e in traj["events"] if e["kind"] == "ignored_params"][-1]["data"]
    assert len(json.dumps(ignored)) < 4000
    assert ignored["stop"].startswith("<") and len(ignored["unknown_fields"]) == 33
    assert "v" * 100 not in json.dumps(ignored)


@pytest.mark.parametrize("pid", [".", "..", ".hidden", "a..b", "a/b", "x" * 65, "a b"])
def test_unsafe_program_ids_are_refused(server: str, pid: str) -> None:
    r = httpx.post(f"{server}/programs", json={"id": pid}, headers={"x-api-key": ADMIN})
    assert r.status_code == 400, r.text


def test_safe_program_ids_are_accepted(server: str) -> None:
    r = httpx.post(f"{server}/programs", json={"id": "task-1.run_2"}, headers={"x-api-key": ADMIN})
    assert r.status_code == 201, r.text


def test_openapi_describes_the_typed_shapes(server: str) -> None:
    spec = httpx.get(f"{server}/openapi.json").json()
    items = spec["components"]["schemas"]["ChatCompletionBody"]["properties"]["messages"]["items"]
    assert {s["$ref"].rsplit("/", 1)[1] for s in items["oneOf"]} >= {"UserMessage", "AssistantMessage"}
    assert (
        "ToolUseBlock" in spec["components"]["schemas"]
        and "FunctionCallItem" in spec["components"]["schemas"]
    )
