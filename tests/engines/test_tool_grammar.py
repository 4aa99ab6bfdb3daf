"""Forced-call grammars: one call, arguments valid against the tool's schema, within budget."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from rollyard.core.errors import InvalidRequest
from rollyard.engines.chat_template import format_tool_call, parse_assistant
from rollyard.engines.tool_grammar import bounded, longest, tool_call_grammar

xgr = pytest.importorskip("xgrammar")
accepts = pytest.importorskip("xgrammar.testing")._is_grammar_accept_string

BASH = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer", "minimum": 1}},
    "required": ["command"],
}
EDIT = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "mode": {"enum": ["append", "replace"]},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["path", "mode"],
}


def admits(grammar: str, name: str, args: dict[str, Any]) -> bool:
    return bool(accepts(xgr.Grammar.from_ebnf(grammar), format_tool_call(name, args)))


def test_the_grammar_admits_schema_valid_calls_in_the_templates_own_form() -> None:
    g = tool_call_grammar([("bash", BASH), ("edit", EDIT)], 4096)
    assert admits(g, "bash", {"command": 'echo "a\\b"\nls', "timeout": 5})  # escapes, newline
    assert admits(g, "edit", {"path": "a.py", "mode": "append", "lines": ["x", "y"]})
    assert not admits(g, "bash", {})  # a required property missing: the old `{}` answer
    assert not admits(g, "bash", {"command": "ls", "extra": 1})
    assert not admits(g, "edit", {"path": "a.py", "mode": "delete"})
    assert not admits(g, "other", {"command": "ls"})
    assert not admits(g, "bash", {"timeout": 5, "command": "ls"})  # properties in schema order


def test_a_named_tool_admits_that_tool_only() -> None:
    g = tool_call_grammar([("edit", EDIT)], 4096)
    assert not admits(g, "bash", {"command": "ls"})
    assert admits(g, "edit", {"path": "p", "mode": "replace"})


@pytest.mark.parametrize("max_tokens", [128, 160, 1024, 4096])
def test_the_longest_admitted_call_fits_the_turns_max_tokens(max_tokens: int) -> None:
    g = xgr.Grammar.from_ebnf(tool_call_grammar([("bash", BASH)], max_tokens))
    lo, hi = 0, max_tokens  # the longest admitted command, by bisection (admitted lengths: 0..n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepts(g, format_tool_call("bash", {"command": "x" * mid})) else (lo, mid)
    n = lo
    assert n >= (max_tokens // 2 - 60) // 2  # the budget is used, not squeezed to nothing
    # the worst case: the longest string, and a number as long as the estimate counts
    worst = {"command": "x" * n, "timeout": 10**22}
    assert accepts(g, format_tool_call("bash", worst))
    jsonschema.validate(worst, BASH)
    assert len(format_tool_call("bash", worst)) <= max_tokens - 1  # one token left for eos


def test_longest_bounds_every_value_a_bounded_schema_admits() -> None:
    b = bounded(EDIT, 5, 2)
    value = {"path": "x" * 5, "mode": "replace", "lines": ["y" * 5, "z" * 5]}
    jsonschema.validate(value, b)
    assert len(json.dumps(value)) <= longest(b, b)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**value, "lines": ["a", "b", "c"]}, b)


def test_bounding_keeps_the_schemas_own_limits_and_refuses_undeclared_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 3},
            "b": {"type": "string", "minLength": 50},
            "c": {"type": "array", "items": {"type": "object", "properties": {"d": {"type": "string"}}}},
        },
    }
    b = bounded(schema, 10, 4)
    assert b["properties"]["a"]["maxLength"] == 3
    assert b["properties"]["b"]["maxLength"] == 50  # a minimum above the cap wins: still valid
    assert b["properties"]["c"]["maxItems"] == 4
    assert b["properties"]["c"]["items"]["properties"]["d"]["maxLength"] == 10
    assert (
        b["additionalProperties"] is False and b["properties"]["c"]["items"]["additionalProperties"] is False
    )
    assert schema["properties"]["a"] == {"type": "string", "maxLength": 3}  # the input is not touched


def test_a_tool_without_parameters_is_called_with_an_empty_object() -> None:
    g = tool_call_grammar([("ping", {})], 64)
    assert admits(g, "ping", {}) and not admits(g, "ping", {"x": 1})


def test_forcing_without_tools_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest):
        tool_call_grammar([], 64)


def test_an_admitted_call_parses_back_to_its_arguments() -> None:
    args = {"path": 'a "b"', "mode": "append", "lines": ["\\n"]}
    assert admits(tool_call_grammar([("edit", EDIT)], 4096), "edit", args)
    parsed = parse_assistant(format_tool_call("edit", args))
    assert parsed.tool_calls[0].arguments == args


@pytest.mark.parametrize(
    "params",
    [
        {"type": "object", "properties": [{}]},  # found by the gateway fuzz test: was a 500
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": "x"}}},
        {"type": "object", "properties": {"a": {"type": "array", "minItems": {}}}},
    ],
)
def test_parameters_that_are_not_a_json_schema_are_a_clear_error(params: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="its parameters are not a JSON schema"):
        tool_call_grammar([("broken", params)], 64)
