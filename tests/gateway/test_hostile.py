"""Second hardening pass: hostile values the first fuzz did not generate, against the real app
over real HTTP (scripted engine). Each test names the class of issue 45 it holds."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rollyard.core.program import Program
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.model_route import STRINGS_PER_OBJECT, count_objects

from .conftest import ADMIN, ScriptedBackend, running, serving
from .test_fuzz import ROUTES, SEEDS, http, mutate, paths, server  # noqa: F401 (fixtures)

NONFINITE = [
    b"1e999",
    b"-1e999",
    b"1E+400",
    b"0.5e00309",
    b"1" + b"0" * 400 + b".0",
    b"1" + b"0" * 300 + b"e99",
]
PLACE = "\u2603placeholder\u2603"

FORCED = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "ls",
                    "parameters": {
                        "type": "object",
                        "properties": {"d": {"type": "string", "maxLength": PLACE}},
                    },
                },
            }
        ],
        "tool_choice": "required",
        "max_tokens": 16,
    },
    "/v1/responses": {
        "input": "hi",
        "tools": [
            {
                "type": "function",
                "name": "ls",
                "parameters": {"type": "object", "properties": {"d": {"type": "string", "maxLength": PLACE}}},
            }
        ],
        "tool_choice": "required",
        "max_output_tokens": 16,
    },
    "/v1/messages": {
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "name": "ls",
                "input_schema": {
                    "type": "object",
                    "properties": {"d": {"type": "string", "maxLength": PLACE}},
                },
            }
        ],
        "tool_choice": {"type": "any"},
    },
}


def with_raw(body: Any, raw: bytes) -> bytes:
    return json.dumps(body).encode().replace(json.dumps(PLACE).encode(), raw)


def post_raw(http: httpx.Client, path: str, content: bytes) -> httpx.Response:  # noqa: F811
    return http.post(path, content=content, headers={"content-type": "application/json"})


# --- class 1: non-finite numbers are a 400, never an OverflowError's 500 ---


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", sorted(FORCED))
def test_an_infinite_max_length_in_a_forced_tool_schema_is_400(
    http: httpx.Client,  # noqa: F811
    path: str,
    stream: bool,
) -> None:
    body = {**FORCED[path], "stream": stream}
    r = post_raw(http, path, with_raw(body, b"1e999"))
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "out of range" in r.text, r.text[:300]
    ok = post_raw(http, path, with_raw(body, b"4"))  # the same body with a finite bound is served
    assert ok.status_code == 200, ok.text[:300]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(ROUTES),
    data=st.data(),
    raw=st.sampled_from(NONFINITE),
    kind=st.sampled_from(["replace", "unknown"]),
)
def test_a_non_finite_number_anywhere_in_a_body_is_400(
    http: httpx.Client,  # noqa: F811
    route: str,
    data: st.DataObject,
    raw: bytes,
    kind: str,
) -> None:
    body = data.draw(st.sampled_from(SEEDS[route]))
    path = data.draw(st.sampled_from(paths(body)))
    content = with_raw(mutate(body, path, kind, PLACE), raw)
    assume(raw in content)  # "unknown" under a list adds nothing
    r = post_raw(http, route, content)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert http.get("/health").status_code == 200


# --- class 2: no client string is control data ---

OLD_SLOT_TEXT = "\x00rollyard-slot\x00"  # the streaming code's marker was this string
STREAMED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    "/v1/responses": {"input": "hi", "stream": True},
    "/v1/messages": {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "stream": True},
}


def streamed_text(http: httpx.Client, path: str, body: dict[str, Any]) -> str:  # noqa: F811
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text[:300]
    assert "internal_error" not in r.text and '"error":{' not in r.text, r.text[-500:]
    return r.text


@pytest.mark.parametrize("path", sorted(STREAMED))
def test_a_model_name_equal_to_the_old_slot_marker_streams_normally(
    http: httpx.Client,  # noqa: F811
    path: str,
) -> None:
    text = streamed_text(http, path, {**STREAMED[path], "model": OLD_SLOT_TEXT})
    assert "ok" in text or "o" in text


CLIENT_TEXT = st.one_of(
    st.text(max_size=24),
    st.sampled_from([OLD_SLOT_TEXT, f"a{OLD_SLOT_TEXT}b", "\x00", '"', "\\", "\u2028"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(sorted(STREAMED)), model=CLIENT_TEXT, user=CLIENT_TEXT)
def test_any_client_strings_stream_without_an_error_event(
    http: httpx.Client,  # noqa: F811
    path: str,
    model: str,
    user: str,
) -> None:
    body = {**STREAMED[path], "model": model, "metadata": {"user_id": user}, "user": user}
    streamed_text(http, path, body)


# --- class 4: the admin token is no program key on the sandboxes' unix socket ---


@contextlib.contextmanager
def serving_uds(app: Any, path: Path) -> Iterator[httpx.Client]:
    """The app on a unix socket (uvicorn in a thread), as ``rollyard gateway --uds`` serves it."""
    with (
        running(uvicorn.Config(app, uds=str(path), log_level="critical")),
        httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://gw", timeout=30) as c,
    ):
        yield c


def test_the_admin_token_gets_403_on_model_endpoints_over_the_sandbox_socket(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    app = create_app(gw, poll_interval_s=0.2)
    with serving_uds(app, tmp_path / "gw.sock") as c:
        prog = gw.programs.create(Program())
        hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for prefix in (f"/p/{prog.id}", f"/p/{prog.id}/v1"):
            r = c.post(f"{prefix}/chat/completions", json=hi, headers={"x-api-key": ADMIN})
            assert r.status_code == 403, (prefix, r.status_code, r.text[:200])
            r = c.post(
                f"{prefix}/messages",
                json={**hi, "max_tokens": 4},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 403, (prefix, r.status_code, r.text[:200])
            assert r.json()["error"]["type"] == "permission_error"
            r = c.post(f"{prefix}/responses", json={"input": "hi"}, headers={"x-api-key": ADMIN})
            assert r.status_code == 403, (prefix, r.status_code, r.text[:200])
            r = c.post(f"{prefix}/completions", json={"prompt": "hi"}, headers={"x-api-key": ADMIN})
            assert r.status_code == 403, (prefix, r.status_code, r.text[:200])
        # the program's own key is served there, and nothing the admin tried was journaled
        r = c.post(f"/p/{prog.id}/v1/chat/completions", json=hi, headers={"x-api-key": prog.api_key})
        assert r.status_code == 200, r.text[:200]
        assert len(gw.journal.trajectory(prog.id).turns) == 1


# --- class 3: finishing a program while its requests are in flight ---


class SlowBackend(ScriptedBackend):
    """Each generation takes ``delay_s``: requests are in flight when the finish arrives."""

    delay_s = 0.4

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_ids, params)


def finish_while_in_flight(url: str, hi: dict[str, Any], at_engine_s: float) -> None:
    """Six concurrent requests of one program, a finish ``at_engine_s`` after they start: every
    answer is 200 or 409, the finish is 200, and the trajectory read right after the finish holds
    exactly the answered turns, numbered without a gap; a request after it gets 409."""
    prog = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()
    key = {"x-api-key": prog["api_key"]}
    warm = httpx.post(f"{url}/v1/chat/completions", json=hi, headers=key, timeout=120)
    assert warm.status_code == 200, warm.text[:200]

    def ask(_: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/chat/completions", json=hi, headers=key, timeout=120)

    admin = {"x-api-key": ADMIN}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(ask, i) for i in range(6)]
        time.sleep(at_engine_s)  # the first is at the engine, the rest queued behind it
        finish = httpx.post(f"{url}/programs/{prog['id']}/finish", json={}, headers=admin, timeout=120)
        traj = httpx.get(f"{url}/programs/{prog['id']}/trajectory", headers=admin).json()
        done = [a.result() for a in answers]
    assert finish.status_code == 200, finish.text[:300]
    codes = [r.status_code for r in done]
    assert all(c in (200, 409) for c in codes), [(r.status_code, r.text[:200]) for r in done]
    assert all("internal_error" not in r.text for r in done)
    ok = codes.count(200)
    assert ok >= 1  # the one at the engine when the finish came completed
    turns = [t for seg in traj["segments"] for t in seg["turns"]]
    assert len(turns) == 1 + ok, (len(turns), codes)  # journaled before the finish was answered
    assert [t["index"] for t in turns] == list(range(len(turns)))
    late = httpx.post(f"{url}/v1/chat/completions", json=hi, headers=key, timeout=30)
    assert late.status_code == 409, late.text[:200]


@pytest.mark.parametrize("stream", [False, True])
def test_finishing_a_program_with_requests_in_flight_journals_every_answered_turn(
    tok: FastTokenizer, tmp_path: Path, stream: bool
) -> None:
    """The order: the finish takes effect at once (new requests 409), the turn in flight completes
    and is journaled, requests queued behind it get 409 before the engine runs, and the finish is
    answered after the turn in flight is journaled; never a 5xx."""
    engine = SlowBackend(tok)
    gw = build_gateway({"fake": engine}, tok, tmp_path / "j.db", ADMIN, "tiny")
    with serving(create_app(gw, poll_interval_s=0.2)) as url:
        hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": stream}
        finish_while_in_flight(url, hi, engine.delay_s / 2)


# --- class 7: typed fields are strict, as the imitated APIs are ---

INTS = {
    "/v1/chat/completions": ["max_tokens", "max_completion_tokens", "top_k", "n", "seed", "top_logprobs"],
    "/v1/responses": ["max_output_tokens", "top_logprobs"],
    "/v1/messages": ["max_tokens", "top_k"],
    "/v1/completions": ["max_tokens", "seed"],
}
FLOATS = {
    "/v1/chat/completions": ["temperature", "top_p", "frequency_penalty", "presence_penalty"],
    "/v1/responses": ["temperature", "top_p"],
    "/v1/messages": ["temperature", "top_p"],
    "/v1/completions": ["temperature", "top_p"],
}
BOOLS = {
    "/v1/chat/completions": ["stream", "logprobs", "parallel_tool_calls", "store"],
    "/v1/responses": ["stream", "store", "parallel_tool_calls"],
    "/v1/messages": ["stream"],
}
BASE = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
}
NUMBER_TEXT = st.from_regex(r"\A-?[0-9]{1,3}(\.[0-9]{1,2})?\Z") | st.sampled_from(
    ["1", "0", "8", "1e1", " 1"]
)
BOOL_TEXT = st.sampled_from(["yes", "no", "true", "false", "True", "1", "0", "on", "off", "y", "t"])
FIELDS = [(r, f, "int") for r, fs in INTS.items() for f in fs]
FIELDS += [(r, f, "float") for r, fs in FLOATS.items() for f in fs]
FIELDS += [(r, f, "bool") for r, fs in BOOLS.items() for f in fs]


def wrong_value(kind: str) -> st.SearchStrategy[Any]:
    if kind == "bool":
        return BOOL_TEXT | st.integers(0, 1) | st.sampled_from([0.0, 1.0])
    return NUMBER_TEXT | st.booleans()


@pytest.mark.parametrize(
    "path, field, value",
    [
        ("/v1/chat/completions", "max_tokens", "8"),
        ("/v1/chat/completions", "stream", "yes"),
        ("/v1/chat/completions", "logprobs", "yes"),
        ("/v1/responses", "stream", "yes"),
        ("/v1/messages", "max_tokens", "8"),
        ("/v1/messages", "stream", 1),
    ],
)
def test_issue_examples_of_lax_coercion_are_400(
    http: httpx.Client,  # noqa: F811
    path: str,
    field: str,
    value: Any,
) -> None:
    r = http.post(path, json={**BASE[path], field: value})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert field in r.text


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=st.sampled_from(FIELDS), data=st.data())
def test_a_typed_field_given_another_json_type_is_400(
    http: httpx.Client,  # noqa: F811
    spec: tuple[str, str, str],
    data: st.DataObject,
) -> None:
    path, field, kind = spec
    value = data.draw(wrong_value(kind))
    r = http.post(path, json={**BASE[path], field: value})
    assert r.status_code == 400, (path, field, value, r.status_code, r.text[:300])
    assert field in r.text, r.text[:300]


# --- class 5: the object count a body is refused by, against the parser's own ---

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[{"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _containers(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + sum(_containers(x) for x in v.values())
    if isinstance(v, list):
        return 1 + sum(_containers(x) for x in v)
    return 0


@settings(max_examples=300, deadline=None)
@given(_ANY_JSON, st.booleans())
def test_the_object_count_is_the_parsers_whenever_it_matters(value: Any, ascii_only: bool) -> None:
    """Brackets, quotes and backslashes inside strings are not counted once the first count is
    over the limit (the bound that decides); with too many strings the first count stands."""
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    first = raw.count(b"{") + raw.count(b"[")
    exact = _containers(value)
    for limit in (1, 4, 1000):
        n = count_objects(raw, limit)
        if first <= limit or raw.count(b'"') > 2 * STRINGS_PER_OBJECT * limit:
            assert n == first
        else:
            assert n == exact, (raw, n, exact)


# --- issue 38: an output format whose type is not a string never reaches the engine ---

FORMATS = [  # (route, field, a body's value for it given a format object ``f``)
    ("/v1/chat/completions", "response_format", lambda f: f),
    ("/v1/responses", "text", lambda f: {"format": f}),
    ("/v1/messages", "output_config", lambda f: {"format": f}),
]


@pytest.fixture(scope="module")
def fmt_server(
    tok: FastTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ScriptedBackend]]:
    backend = ScriptedBackend(tok)
    gw = build_gateway({"fake": backend}, tok, tmp_path_factory.mktemp("fmt") / "j.db", ADMIN, "tiny")
    with serving(create_app(gw, poll_interval_s=0.2)) as url:
        yield url, backend


def api_error(path: str, r: httpx.Response) -> dict[str, Any]:
    """The error object, checked to be in ``path``'s API's own shape."""
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == "invalid_request_error", body
    return body["error"]


@pytest.mark.parametrize(
    "bad", [{"type": 5}, {"type": None}, {"type": ["json_object"]}, 5, "json_object", []]
)
@pytest.mark.parametrize("path, field, wrap", FORMATS)
def test_an_output_format_whose_type_is_not_a_string_is_400_in_the_apis_format(
    fmt_server: tuple[str, ScriptedBackend], path: str, field: str, wrap: Any, bad: Any
) -> None:
    url, backend = fmt_server
    key = httpx.post(f"{url}/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"]
    with httpx.Client(base_url=url, headers={"x-api-key": key}, timeout=30) as c:
        served = len(backend.prompts)
        r = c.post(path, json={**BASE[path], field: wrap(bad)})
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert field in api_error(path, r)["message"], r.text[:300]
        assert len(backend.prompts) == served  # refused before the engine
        ok = c.post(path, json={**BASE[path], field: wrap({"type": "json_object"})})
        assert ok.status_code == 200, ok.text[:300]  # a well-typed one is served (and ignored)
        assert len(backend.prompts) == served + 1
