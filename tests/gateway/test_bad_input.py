"""Client mistakes get the dialect's error shape and a 4xx; engine trouble a 503 with Retry-After."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from .conftest import ADMIN, ScriptedBackend, new_program

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"


def post(client: TestClient, path: str, key: str, body: object) -> tuple[int, dict]:
    r = client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
    return r.status_code, r.json()


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": "nope"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, None),
        ({"messages": []}, None),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, None),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, None),
    ],
)
def test_openai_bad_requests_get_400_openai_errors(client: TestClient, body: dict, param: str | None) -> None:
    key = new_program(client)["api_key"]
    status, err = post(client, CHAT, key, body)
    assert status == 400
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["type"] == "invalid_request_error"
    if param:
        assert err["error"]["param"] == param


def test_malformed_json_gets_400_not_500(client: TestClient) -> None:
    key = new_program(client)["api_key"]
    r = client.post(
        CHAT,
        content=b"{not json",
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("path", [CHAT, MSGS, "/v1/responses"])
def test_a_body_nested_too_deep_gets_400_with_the_reason(client: TestClient, path: str) -> None:
    key = new_program(client)["api_key"]
    body = '{"messages": [{"role": "user", "content": "x", "x": ' + "[" * 1000 + "]" * 1000 + "}]}"
    r = client.post(
        path, content=body, headers={"Authorization": f"Bearer {key}", "content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("request body is not valid JSON: recursion limit exceeded"), message


def test_anthropic_errors_use_the_anthropic_shape(client: TestClient) -> None:
    status, err = post(
        client, MSGS, "wrong-key", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 401
    assert err["type"] == "error" and err["error"]["type"] == "authentication_error"
    key = new_program(client)["api_key"]
    status, err = post(client, MSGS, key, {"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]})
    assert status == 400 and err["error"]["type"] == "invalid_request_error"


def test_an_anthropic_user_block_of_an_unsupported_type_is_400(client: TestClient) -> None:
    """Found by schemathesis: the refusal itself crashed (500) on the block's type."""
    key = new_program(client)["api_key"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    status, err = post(
        client, MSGS, key, {"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]}
    )
    assert status == 400 and "image" in err["error"]["message"], err


def test_prompt_over_the_context_limit_is_400_context_length_exceeded(client: TestClient) -> None:
    key = new_program(client, context_limit=20)["api_key"]
    status, err = post(client, CHAT, key, {"messages": [{"role": "user", "content": "word " * 50}]})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"


def test_unknown_key_is_401_and_finished_program_is_409(client: TestClient) -> None:
    status, err = post(client, CHAT, "ry-nobody", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 401 and err["error"]["type"] == "authentication_error"
    prog = new_program(client)
    r = client.post(
        f"/programs/{prog['id']}/finish", json={"status": "success"}, headers={"x-api-key": ADMIN}
    )
    assert r.status_code == 200 and r.json()["state"] == "finished"
    status, err = post(client, CHAT, prog["api_key"], {"messages": [{"role": "user", "content": "x"}]})
    assert status == 409


def test_dead_engine_answers_503_with_retry_after(client: TestClient, engine: ScriptedBackend) -> None:
    key = new_program(client)["api_key"]
    engine.down = True
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]}, headers={"x-api-key": key})
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_admin_endpoints_refuse_program_keys_and_missing_tokens(client: TestClient) -> None:
    prog = new_program(client)
    assert client.post("/programs", json={}).status_code == 401
    assert client.post("/programs", json={}, headers={"x-api-key": prog["api_key"]}).status_code == 401
    other = new_program(client)
    r = client.get(f"/programs/{other['id']}/trajectory", headers={"x-api-key": prog["api_key"]})
    assert r.status_code == 401
    # A program key reaches only model endpoints, not even its own program's records.
    for path in (f"/programs/{prog['id']}", f"/programs/{prog['id']}/trajectory"):
        assert client.get(path, headers={"x-api-key": prog["api_key"]}).status_code == 401
    listing = client.get("/programs", headers={"x-api-key": ADMIN}).json()["data"]
    assert listing and all("api_key" not in p for p in listing)


def test_health_models_and_metrics_answer(client: TestClient, engine: ScriptedBackend) -> None:
    key = new_program(client)["api_key"]
    client.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]}, headers={"x-api-key": key})
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/v1/models", headers={"x-api-key": key}).json()["data"][0]["id"] == "tiny"
    assert client.get("/metrics").status_code == 401  # closed by default (--open-metrics opens it)
    assert client.get("/metrics", headers={"x-api-key": key}).status_code == 401
    text = client.get("/metrics", headers={"x-api-key": ADMIN}).text
    assert 'rollyard_gateway_requests_total{api="openai_chat",outcome="ok"} 1.0' in text
    assert 'rollyard_gateway_programs{state="active"} 1.0' in text


def test_a_refused_call_is_an_event_of_its_program_and_a_looping_client_is_bounded(
    client: TestClient,
) -> None:
    """A program whose calls all fail still has a trajectory that says why (issue: "the
    trajectory of a program whose every call failed is empty"); a client retrying the same
    bad call forever adds at most ``MAX_ERROR_EVENTS`` events."""
    from rollyard.gateway.errors import MAX_ERROR_EVENTS

    from .conftest import trajectory

    prog = new_program(client)
    key, pid = str(prog["api_key"]), str(prog["id"])
    assert post(client, CHAT, key, {"messages": [{"role": "wizard", "content": "x"}]})[0] == 400
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    r = client.post(CHAT, content=b"{nope", headers=headers)
    assert r.status_code == 400
    assert post(client, MSGS, key, {"max_tokens": 0, "messages": []})[0] == 400
    events = [e for e in trajectory(client, pid)["events"] if e["kind"] == "request_error"]
    assert [(e["data"]["status"], e["data"]["path"]) for e in events] == [
        (400, CHAT),
        (400, CHAT),
        (400, MSGS),
    ]
    assert events[1]["data"]["code"] == "invalid_json" and events[1]["data"]["body_bytes"] == 5
    assert "role" in events[0]["data"]["message"]
    other = new_program(client)  # another program's log is its own
    assert not [e for e in trajectory(client, str(other["id"]))["events"] if e["kind"] == "request_error"]
    for _ in range(MAX_ERROR_EVENTS + 5):
        post(client, CHAT, key, {"messages": []})
    events = [e for e in trajectory(client, pid)["events"] if e["kind"] == "request_error"]
    assert len(events) == MAX_ERROR_EVENTS


DEEP = "[" * 100_000  # a JSON text nested past what json reads (once a RecursionError: a 500)


@pytest.mark.parametrize("api", ["openai", "responses"])
def test_tool_call_arguments_nested_past_jsons_depth_are_kept_as_text(client: TestClient, api: str) -> None:
    key = new_program(client)["api_key"]
    user = {"role": "user", "content": "go"}
    if api == "openai":
        call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": DEEP}}
        msgs = [user, {"role": "assistant", "content": None, "tool_calls": [call]}]
        msgs.append({"role": "tool", "tool_call_id": "c1", "content": "a"})
        path, body = CHAT, {"messages": msgs, "max_tokens": 4}
    else:
        items = [user, {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": DEEP}]
        items.append({"type": "function_call_output", "call_id": "c1", "output": "a"})
        path, body = "/v1/responses", {"input": items, "max_output_tokens": 16}
    status, answer = post(client, path, key, body)
    assert status == 200, answer
    if api == "openai":  # the next turn's history is compared with the recorded one, call and all
        msgs += [answer["choices"][0]["message"], {"role": "user", "content": "more"}]
        status, answer = post(client, path, key, body)
        assert status == 200, answer
