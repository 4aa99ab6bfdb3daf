"""The search for numbers that may leave a double's range, done in C, finds whatever the
regular expression it replaced finds (it may find more: a walk of the parsed body then says)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.gateway.limits import _maybe_huge, strict_json

RULE = re.compile(rb"[eE][+-]?\d{3}|\d{17}")


@given(raw=st.lists(st.sampled_from(list(b'0123456789eE+-. ,x"')), max_size=40).map(bytes))
def test_the_search_misses_nothing_the_expression_finds(raw: bytes) -> None:
    if RULE.search(raw):
        assert _maybe_huge(raw)


@pytest.mark.parametrize("literal", [b"1e999", b"-1E+400", b"1" + b"0" * 400 + b".0"])
@pytest.mark.parametrize("commas", [0, 2000])  # few values: walked at once; many: searched first
def test_a_number_out_of_range_is_refused_in_a_small_body_and_a_large_one(
    literal: bytes, commas: int
) -> None:
    raw = b'{"a":[' + b"1," * commas + literal + b'],"t":"' + b"x" * 5000 + b'"}'
    with pytest.raises(ValueError, match="out of range"):
        strict_json(raw)
    assert strict_json(raw.replace(literal, b"4"))["a"][-1] == 4
