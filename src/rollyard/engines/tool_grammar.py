"""Forced tool calls as a grammar: the chat template's call wrapper around each tool's JSON schema.

``tool_choice: required`` (or a named tool) must give a call whose arguments parse and validate
against the tool's ``parameters``, not ``{}``. vLLM's structured outputs take either a JSON
schema (the bare arguments object, without the ``<tool_call>`` wrapper the parser expects) or a
grammar, so the gateway sends a grammar: for each allowed tool, the wrapper text of
``chat_template.tool_call_frame`` around xgrammar's grammar for the schema (canonical
separators ``", "`` and ``": "``, no free whitespace, undeclared properties refused), one
alternative per tool. xgrammar ships with vLLM; it is imported only when a call is forced.

Every forced call ends within the turn's ``max_tokens``. A random model (tests, the smoke
configs) almost never closes a string by chance, so strings without ``maxLength`` get one and
arrays without ``maxItems`` get one, sized so that the longest call the grammar admits has no
more characters than ``max_tokens - 1`` (one token left for the end of turn); one token per
character is the worst case for ASCII text. The constrained output is therefore a bounded
subset of what the schema admits: it still validates against the original schema. What is not
bounded: numbers (a random model ends them within a few digits; each is counted as
``NUMBER_CHARS``) and strings with a ``pattern`` or ``format`` (counted as ``PATTERN_CHARS``).
Non-ASCII text or escapes can take more tokens than characters; such a call may still be cut by
``max_tokens`` and is then returned as text and flagged ``malformed_tool_call``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from rollyard.core.errors import InvalidRequest
from rollyard.engines.chat_template import tool_call_frame

NUMBER_CHARS = 24
PATTERN_CHARS = 64
ITEMS_CAPS = (16, 4, 1)  # maxItems tried, largest first, for arrays that set none
MIN_STRING_CHARS = 32  # fewer array items before strings shorter than this
_UNBOUNDED = 1 << 30
_SUBSCHEMA = ("items", "not", "if", "then", "else", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_MAX_DEPTH = 16

# xgrammar writes a string with maxLength as `X_characters{0, N}` over a class that allows raw
# control characters and no escapes at all; JSON needs the opposite (quotes, backslashes and
# newlines are legal when escaped), so the class is rewritten to JSON's own.
_BOUNDED_CHARS = re.compile(r'^(\S+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
_JSON_CHAR = r'(([^\0-\x1f\"\\]) | ("\\" basic_escape))'


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if isinstance(t, list):
        return [str(x) for x in t]
    if isinstance(t, str):
        return [t]
    if "properties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    return []


def bounded(schema: Any, string_cap: int, items_cap: int) -> Any:
    """A copy of ``schema`` whose strings, arrays and objects are bounded (see module doc)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if key in schema:
            out[key] = bounded(schema[key], string_cap, items_cap)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [bounded(v, string_cap, items_cap) for v in schema[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {k: bounded(v, string_cap, items_cap) for k, v in schema[key].items()}
    types = _types(schema)
    free = "enum" not in schema and "const" not in schema
    if free and "string" in types and "pattern" not in schema and "format" not in schema:
        # a schema's own minimum wins over the budget: the call must still validate
        cap = max(string_cap, int(schema.get("minLength", 0)))
        out["maxLength"] = min(int(schema.get("maxLength", cap)), cap)
    if free and "array" in types:
        cap = max(items_cap, int(schema.get("minItems", 0)))
        out["maxItems"] = min(int(schema.get("maxItems", cap)), cap)
    if "object" in types:
        out["additionalProperties"] = False  # declared properties only: a subset of the schema
    return out


def longest(schema: Any, root: dict[str, Any], depth: int = 0) -> int:
    """An upper bound on the characters of a JSON value ``schema`` (already ``bounded``) admits."""
    if depth > _MAX_DEPTH or not isinstance(schema, dict):
        return _UNBOUNDED
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target: Any = root
        for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else [None]:
            target = target.get(part) if isinstance(target, dict) and part else None
        return longest(target, root, depth + 1)
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            return max((len(json.dumps(v, separators=(", ", ": "))) for v in values), default=0)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return max((longest(s, root, depth + 1) for s in schema[key]), default=0)
    types = _types(schema) or ["any"]
    return max(_longest_of(t, schema, root, depth) for t in types)


def _longest_of(kind: str, schema: dict[str, Any], root: dict[str, Any], depth: int) -> int:
    if kind == "string":
        if "maxLength" not in schema:
            return PATTERN_CHARS
        return 2 + int(schema["maxLength"])
    if kind in ("integer", "number"):
        return NUMBER_CHARS
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        item = longest(schema.get("items", {}), root, depth + 1)
        return 2 + int(schema.get("maxItems", _UNBOUNDED)) * (item + 2)
    if kind == "object":
        props = schema.get("properties") or {}
        return 2 + sum(len(json.dumps(k)) + 4 + longest(v, root, depth + 1) for k, v in props.items())
    return _UNBOUNDED


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as e:  # the gateway runs without an engine installed only in unit tests
        raise InvalidRequest("forced tool calls need xgrammar (installed with vLLM)") from e
    return xgrammar


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _fit(schema: dict[str, Any], budget: int) -> dict[str, Any]:
    """The bounded schema whose longest value fits ``budget`` characters: as many array items as
    leave strings ``MIN_STRING_CHARS`` or more, then the longest strings that fit."""
    b = schema
    for items in ITEMS_CAPS:
        floor = 1 if items == ITEMS_CAPS[-1] else MIN_STRING_CHARS
        cap = max(1, budget)
        while cap >= floor:
            b = bounded(schema, cap, items)
            if longest(b, b) <= budget:
                return b
            cap //= 2
    return b  # nothing fits (numbers or patterns alone exceed it): the tightest bounds


@functools.lru_cache(maxsize=256)
def _grammar(tools_json: str, budget: int) -> str:
    xgr = _xgrammar()
    alternatives = []
    for name, params in json.loads(tools_json):
        prefix, suffix = tool_call_frame(name)
        schema = params if isinstance(params, dict) and params else {"type": "object"}
        try:
            args = _fit(schema, budget - len(prefix) - len(suffix))
        except (
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
        ) as e:  # properties a list, maxLength "x" or inf
            raise InvalidRequest(f"tool {name!r}: its parameters are not a JSON schema: {e}") from e
        try:
            g = xgr.Grammar.from_json_schema(
                json.dumps(args), any_whitespace=False, separators=(", ", ": "), strict_mode=True
            )
        except Exception as e:  # xgrammar raises bare RuntimeErrors on schemas it cannot take
            raise InvalidRequest(f"tool {name!r}: its parameters schema cannot be enforced: {e}") from e
        g = xgr.Grammar.from_ebnf(_BOUNDED_CHARS.sub(lambda m: f"{m[1]} ::= {_JSON_CHAR}", str(g)))
        frame = [xgr.Grammar.from_ebnf(f"root ::= {_literal(t)}") for t in (prefix, suffix)]
        alternatives.append(xgr.Grammar.concat(frame[0], g, frame[1]))
    return str(xgr.Grammar.union(*alternatives))


def tool_call_grammar(tools: Sequence[tuple[str, dict[str, Any]]], max_tokens: int) -> str:
    """An xgrammar EBNF admitting exactly one call to one of ``tools`` (name, parameters schema)
    whose arguments validate against its schema and whose text fits ``max_tokens - 1`` tokens.

    The budget is rounded down to its four leading bits (at most 1/8 lost) so that grammars
    repeat across turns whose room differs by a few tokens: each is built once per tool set and
    budget, and vLLM caches compiled grammars by their text."""
    if not tools:
        raise InvalidRequest("a forced tool call needs at least one tool")
    budget = max(1, max_tokens - 1)
    drop = max(0, budget.bit_length() - 4)
    budget = budget >> drop << drop
    return _grammar(json.dumps([[n, p] for n, p in tools]), budget)  # property order kept
