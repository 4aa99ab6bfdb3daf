"""Parse only what a chat body adds to its program's previous one.

An agent sends its whole conversation every turn: the previous request's messages, byte for
byte, then the assistant message it was given and the new ones. Parsing, checking and
validating the whole body each turn cost the gateway CPU in proportion to the history (at 30k
tokens, ~0.7 ms of the event loop per turn for JSON, bracket count, non-finite walk, pydantic
and message parsing). A ``BodyPrefix`` remembers, per program, the bytes of its last body up
to the end of the last element of ``messages`` and what was made of them; a body that starts
with those bytes is parsed from there on only.

Why it is the same as a full parse: JSON is read left to right, so the same bytes leave any
parser in the same place (inside the top-level object, inside ``messages``, after a whole
element) having read the same values; what follows is parsed as a small document of its own,
``{"\\u0000": [<new elements>] <rest of the body>``, which is valid exactly when the rest is
valid in that place. The fields before ``messages`` are the remembered ones; the fields after
it are the small document's, set in order over them (a repeated key keeps its first place and
takes its last value, as in a full parse). Anything unusual (no remembered prefix, different
bytes, a second ``messages`` key, a rest that is not valid JSON, a body over the object limit)
takes the full path, whose answer (and error, with its location) is today's. The only state
shared between turns is immutable (bytes, validated items nobody mutates, frozen messages), so a
prefix from any earlier body of the program gives the same result as a full parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rollyard.gateway.limits import strict_json

# The small document's array key: a NUL, which no client key can be unescaped (checked below).
_NEW = "\x00"
_OPEN = b'{"\\u0000":['
# That key as a whole JSON string: the only spelling of a key equal to it (a NUL is written
# ``\u0000`` or not at all). A NUL inside a longer string (random text from a tiny model holds
# some) is no key of ours; matching the bare escape sent such a turn, and the next, the full way.
_NEW_KEY = b'"\\u0000"'
_WS = re.compile(r"[ \t\n\r]*")
_scan = json.JSONDecoder().scan_once  # the C scanner: (value, end index) of the value at an index
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]


@dataclass
class BodyPrefix:
    """A program's last body up to the end of its last message, and what it holds. Never
    changed once made, but for ``parsed``, set once by the dialect that parses its messages."""

    model: type  # the body model its messages were validated by (one per route)
    prefix: bytes  # the body's bytes up to the end of the last element of ``messages``
    head: dict[str, Any]  # the fields before ``messages`` (with ``messages: []`` in its place)
    messages: list[Any]  # the validated messages (the model's items, not to be mutated)
    objects: int  # ``{`` and ``[`` bytes in ``prefix`` (check_objects' first count)
    parsed: list[Any] | None = None  # the dialect's messages made from them, if it keeps them


@dataclass
class Seen:
    """A body that parsed in full, its prefix not located yet: that is done (``remember``) when
    the program's next body starts as this one does (most bodies that are not extended, such
    as one-message chats, are then never scanned twice)."""

    model: type
    raw: bytes
    messages: list[Any]
    parsed: list[Any] | None = None


# The next body must repeat this many bytes from the key ``"messages"`` on before the previous
# one is scanned: a body that differs there shares no whole message with it (one that extends a
# shorter history takes the full path once; nothing but time depends on it).
GATE_BYTES = 64


@dataclass
class Extension:
    """A body parsed past a ``BodyPrefix``: the fields to validate (only the new messages)."""

    known: BodyPrefix
    data: dict[str, Any]
    rest: bytes  # the body after ``known.prefix``


def _ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _elements_end(text: str, i: int) -> tuple[int, int] | None:
    """From ``i`` (after ``[`` or after an element), skip elements: (end of the last one, how
    many), or None if the array does not close as plain JSON."""
    count, end = 0, i
    i = _ws(text, i)
    if text[i : i + 1] == "]":
        return end, 0
    while True:
        _, i = _scan(text, i)
        end, count = i, count + 1
        i = _ws(text, i)
        c = text[i : i + 1]
        if c == "]":
            return end, count
        if c != ",":
            return None
        i = _ws(text, i + 1)


def _byte_offset(text: str, i: int, ascii_only: bool) -> int:
    return i if ascii_only else len(text[:i].encode())


def remember(raw: bytes, model: type, messages: list[Any]) -> BodyPrefix | None:
    """The prefix of a body that parsed and validated in full (``messages``: its validated
    messages), or None when its top-level ``messages`` cannot be located plainly (an empty or
    repeated one, a non-object body...): then the next body takes the full path."""
    try:
        text = raw.decode()
        i = _ws(text, 0)
        if text[i : i + 1] != "{":
            return None
        i = _ws(text, i + 1)
        while text[i : i + 1] == '"':
            key, i = _scanstring(text, i + 1)
            i = _ws(text, i)
            if text[i : i + 1] != ":":
                return None
            i = _ws(text, i + 1)
            if key == "messages":
                if text[i : i + 1] != "[":
                    return None
                span = _elements_end(text, i + 1)
                if span is None or span[1] != len(messages) or not messages:
                    return None
                ascii_only = raw.isascii()
                start, end = _byte_offset(text, i, ascii_only), _byte_offset(text, span[0], ascii_only)
                head = strict_json(raw[:start] + b"[]}")
                if not isinstance(head, dict):
                    return None
                prefix = raw[:end]
                after = strict_json(_OPEN + raw[end:].lstrip(b" \t\n\r"))
                if "messages" in after:  # a later one wins in a full parse
                    return None
                return BodyPrefix(model, prefix, head, messages, prefix.count(b"{") + prefix.count(b"["))
            _, i = _scan(text, i)
            i = _ws(text, i)
            if text[i : i + 1] != ",":
                return None
            i = _ws(text, i + 1)
    except (ValueError, StopIteration, IndexError):
        return None
    return None


def _located(seen: Seen, raw: bytes) -> BodyPrefix | None:
    """``seen``'s prefix, if ``raw`` may extend it (see ``GATE_BYTES``)."""
    at = seen.raw.find(b'"messages"')
    if at < 0 or not raw.startswith(seen.raw[: at + GATE_BYTES]):
        return None
    made = remember(seen.raw, seen.model, seen.messages)
    if made is not None:
        made.parsed = seen.parsed
    return made


def extend(raw: bytes, known: BodyPrefix | Seen | None, model: type, max_objects: int) -> Extension | None:
    """``raw`` parsed past ``known`` when it starts with its prefix; None: take the full path."""
    if known is None or known.model is not model:
        return None
    located = _located(known, raw) if isinstance(known, Seen) else known
    if located is None or not raw.startswith(located.prefix):
        return None
    known = located
    rest = raw[len(known.prefix) :]
    if known.objects + rest.count(b"{") + rest.count(b"[") > max_objects:
        return None  # the full path refuses it, with its count
    tail = rest.lstrip(b" \t\n\r")
    if tail[:1] == b",":
        doc = _OPEN + tail[1:]
    elif tail[:1] == b"]":
        doc = _OPEN + tail
    else:
        return None
    if _NEW_KEY in tail:  # a client key that could be the small document's own
        return None
    try:
        small = strict_json(doc)
    except ValueError:
        return None
    new = small.pop(_NEW)
    if "messages" in small or (tail[:1] == b"," and not new):  # a later key, or "[..., ]"
        return None
    data = dict(known.head)
    data["messages"] = new
    for k, v in small.items():
        data[k] = v
    return Extension(known, data, rest)


def advance(ext: Extension, messages: list[Any]) -> BodyPrefix | None:
    """The prefix after an extended body (``messages``: all its validated messages): the known
    one, grown by the new elements (only those are scanned)."""
    known = ext.known
    added = len(messages) - len(known.messages)
    if added == 0:
        return known
    rest = ext.rest
    try:
        text = rest.decode()
        i = _ws(text, 0)
        if text[i : i + 1] != ",":
            return None
        span = _elements_end(text, i + 1)
    except (ValueError, StopIteration, IndexError):
        return None
    if span is None or span[1] != added:
        return None
    grown = rest[: _byte_offset(text, span[0], rest.isascii())]
    return BodyPrefix(
        known.model,
        known.prefix + grown,
        known.head,
        messages,
        known.objects + grown.count(b"{") + grown.count(b"["),
    )
