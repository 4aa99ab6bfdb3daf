"""A body parsed past its program's previous one (``body_prefix``) is the body a full parse gives.

The property: for generated histories, serialized the ways clients do (spaces or not, escaped
or raw non-ASCII, fields before and after ``messages``, repeated keys), each grown by new
messages or changed where a client may change it (an edited or dropped message, a body cut
short, a trailing comma, a repeated ``messages``), the short path either declines (the full
path then answers) or gives exactly the full parse's validated body and error-free result.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollyard.gateway.bodies import ChatCompletionBody, MessagesBody
from rollyard.gateway.body_prefix import BodyPrefix, Seen, advance, extend, remember
from rollyard.gateway.limits import strict_json

from .conftest import new_program

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
content = st.one_of(
    text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
)
call = st.fixed_dictionaries(
    {
        "id": text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": text, "arguments": text}),
    }
)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer"]), "content": content}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(st.none(), text)},
        optional={"tool_calls": st.lists(call, max_size=2), "reasoning_content": text},
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": text}, optional={"tool_call_id": text}),
)
# now and then an invalid one: the full path refuses it, the short path must too
invalid = st.fixed_dictionaries({"role": st.sampled_from(["robot", 5]), "content": text})
some = st.lists(st.one_of(message, message, message, message, message, invalid), max_size=3)
scalar = st.one_of(st.integers(-5, 5), st.floats(0, 1), text, st.booleans(), st.none())
# "\x00": the short path's own key for the new messages, which a client's key must not take
valid_fields = st.dictionaries(
    st.sampled_from(["model", "user", "extra", "metadata_x", "\x00"]), text, max_size=3
)
# any value: some of them invalid for the field (a 400 on both paths)
fields = st.one_of(
    valid_fields,
    st.dictionaries(
        st.sampled_from(["max_tokens", "temperature", "stream", "top_p", "seed", "model"]), scalar
    ),
)
style = st.sampled_from([(", ", ": ", True), (",", ":", False), (",", ":", True), (", ", ": ", False)])


def dumps(
    head: dict[str, Any], messages: list[Any], tail: dict[str, Any], how: tuple[str, str, bool]
) -> bytes:
    """A body as a client writes it: ``head`` fields, ``messages``, ``tail`` fields (a key in
    both is written twice, as a client may)."""
    item, key, ascii_only = how

    def j(v: Any) -> str:
        return json.dumps(v, separators=(item, key), ensure_ascii=ascii_only)

    parts = [f"{j(k)}{key}{j(v)}" for k, v in head.items()]
    parts.append(f'"messages"{key}{j(messages)}')
    parts += [f"{j(k)}{key}{j(v)}" for k, v in tail.items()]
    return ("{" + item.join(parts) + "}").encode()


def full(raw: bytes, model: type) -> Any:
    """What the full path gives: the validated body, or the kind of error."""
    try:
        data = strict_json(raw)
    except ValueError:
        return "json_invalid"
    try:
        return model.model_validate(data)
    except ValidationError as e:
        return ("invalid", str(e))


def short(raw: bytes, known: Any, model: type) -> Any:
    """What the short path gives, or None where it declines."""
    ext = extend(raw, known, model, 50_000)
    if ext is None:
        return None
    try:
        body = model.model_validate(ext.data)
    except ValidationError:
        return "declined_to_full"  # the route validates the full body then, for its error
    body.messages = ext.known.messages + body.messages
    return body, ext


def same(a: Any, b: Any) -> bool:
    return (
        a.model_dump() == b.model_dump()
        and a.model_fields_set == b.model_fields_set
        and list(a.model_extra or {}) == list(b.model_extra or {})
    )


changes = st.sampled_from(["grow", "grow", "grow", "edit", "drop", "cut", "comma", "again", "fields"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(message, min_size=1, max_size=4),
    head=valid_fields,
    tail=valid_fields,
    how=style,
    turns=st.lists(st.tuples(changes, some, fields), max_size=6),
)
def test_the_short_path_gives_the_full_parse_or_declines(
    first: list[Any], head: dict[str, Any], tail: dict[str, Any], how: Any, turns: list[Any]
) -> None:
    model = ChatCompletionBody
    messages = list(first)
    raw = dumps(head, messages, tail, how)
    whole = full(raw, model)
    known: Any = Seen(model, raw, whole.messages) if not isinstance(whole, (str, tuple)) else None
    for change, new, new_tail in turns:
        messages = messages + new
        body_tail = tail
        if change == "edit" and messages:
            messages = [{"role": "user", "content": "edited"}, *messages[1:]]
        elif change == "drop" and len(messages) > 1:
            messages = messages[1:]
        elif change == "fields":
            body_tail = new_tail
        raw = dumps(head, messages, body_tail, how)
        if change == "cut":
            raw = raw[: len(raw) - 2]
        elif change == "comma":
            raw = raw.replace(b"]", b", ]", 1) if not new else raw
        elif change == "again":  # a second messages key after the first: it wins in a full parse
            raw = raw[:-1] + b',"messages":[]}'
        whole = full(raw, model)
        got = short(raw, known, model)
        if got is not None and got != "declined_to_full":
            body, ext = got
            assert not isinstance(whole, (str, tuple)), (raw, whole)
            assert same(body, whole), raw
            known = advance(ext, body.messages)
        else:
            if got == "declined_to_full":
                assert isinstance(whole, tuple), raw  # a validation error: the full path's own
            known = Seen(model, raw, whole.messages) if not isinstance(whole, (str, tuple)) else None
        if isinstance(known, BodyPrefix):
            assert raw.startswith(known.prefix)
            assert len(known.messages) == len(whole.messages)


def test_an_extending_body_takes_the_short_path_and_reuses_the_known_messages(client: TestClient) -> None:
    """Through the app: the second turn's known messages are the first turn's own objects (the
    short path fired), a changed history is still a rewrite, and the answers are unchanged."""
    p = new_program(client)
    headers = {"Authorization": f"Bearer {p['api_key']}"}
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]

    def turn() -> dict[str, Any]:
        r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs}, headers=headers)
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"]
        msgs.append({"role": "assistant", "content": answer["content"]})
        return r.json()

    turn()
    first = gw.conversations[p["id"]]
    assert gw.body_prefixes[p["id"]].parsed == first.messages
    msgs.append({"role": "user", "content": "again"})
    turn()
    second = gw.conversations[p["id"]]
    assert second.segment == first.segment  # extended
    assert all(a is b for a, b in zip(first.messages, second.messages, strict=False))
    msgs[1] = {"role": "user", "content": "HI"}  # an edited history: a rewrite, as before
    msgs.append({"role": "user", "content": "and again"})
    turn()
    assert gw.conversations[p["id"]].segment == first.segment + 1
    # a bad message in the new part: the full path's error, with its index in the whole body
    bad = [*msgs, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": bad}, headers=headers)
    assert r.status_code == 400 and f"messages[{len(bad) - 1}]" in r.text, r.text


@pytest.mark.parametrize("model", [ChatCompletionBody, MessagesBody])
def test_no_prefix_for_a_body_whose_messages_cannot_be_located(model: type) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert remember(b'{"messages": []}', model, []) is None
    twice = (
        json.dumps({"messages": msgs}).encode()[:-1] + b', "messages": [{"role": "user", "content": "x"}]}'
    )
    assert remember(twice, model, msgs) is None
    ok = json.dumps({"model": "m", "messages": msgs, "max_tokens": 3}).encode()
    known = remember(ok, model, msgs)
    assert known is not None and known.prefix == ok[: ok.index(b"}]") + 1]


def test_an_anthropic_body_reuses_the_known_messages_too(client: TestClient) -> None:
    p = new_program(client)
    headers = {"x-api-key": p["api_key"], "anthropic-version": "2023-06-01"}
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing test in tests/test_io.py"}]

    def turn() -> None:
        body = {"model": "tiny", "system": "be brief", "max_tokens": 16, "messages": msgs}
        r = client.post("/v1/messages", json=body, headers=headers)
        assert r.status_code == 200, r.text
        msgs.append({"role": "assistant", "content": r.json()["content"]})

    turn()
    first = gw.conversations[p["id"]]
    msgs.append({"role": "user", "content": [{"type": "text", "text": "again"}]})
    turn()
    second = gw.conversations[p["id"]]
    assert second.segment == first.segment
    assert second.messages[1] is first.messages[1]  # the user message, after the system prompt


def test_the_short_path_fires_behind_a_real_server(client: TestClient) -> None:
    """Through uvicorn (each request a task of its own, the model endpoints' short way in)."""
    import httpx

    from .conftest import serving

    p = new_program(client)
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing test in tests/test_io.py"}]
    states = []
    with serving(client.app) as url:
        for text in ("again", "and again"):
            body = {"model": "tiny", "messages": msgs}
            r = httpx.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {p['api_key']}"}
            )
            assert r.status_code == 200, r.text
            msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]
            msgs += [{"role": "user", "content": text}]
            states.append(gw.conversations[p["id"]])
    assert states[1].segment == states[0].segment
    assert states[1].messages[0] is states[0].messages[0]


def test_a_nul_in_a_message_keeps_the_short_path_and_a_nul_key_declines() -> None:
    """A NUL inside a message's text (random tiny-model output holds some) is no key: the body
    is still parsed past the prefix; a top-level key that is exactly NUL would take the small
    document's own key, so that body declines (the full path answers)."""
    model = ChatCompletionBody
    first = [{"role": "user", "content": "hi"}]
    raw = json.dumps({"model": "tiny", "messages": first}).encode()
    known = remember(raw, model, model.model_validate(strict_json(raw)).messages)
    assert known is not None
    grown = [*first, {"role": "assistant", "content": "a\x00b"}, {"role": "user", "content": "\x00!"}]
    raw2 = json.dumps({"model": "tiny", "messages": grown}).encode()
    assert b"\\u0000" in raw2
    got = short(raw2, known, model)
    assert got is not None and got != "declined_to_full"
    assert same(got[0], full(raw2, model))
    keyed = json.dumps({"model": "tiny", "messages": grown, "\x00": "x"}).encode()
    assert extend(keyed, known, model, 50_000) is None
