"""SSE framing: a filled frame is the event it stands for; a primed stream raises early and
yields every item in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.gateway.sse import SLOT, Frame, event, primed

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


@given(_TEXT, st.integers(0, 10**9), st.sampled_from([None, "content_block_delta"]))
def test_a_filled_frame_is_the_event_of_its_data(text: str, seq: int, name: str | None) -> None:
    data = {"type": "d", "sequence_number": SLOT, "delta": {"text": SLOT}, "logprobs": []}
    filled = {"type": "d", "sequence_number": seq, "delta": {"text": text}, "logprobs": []}
    assert Frame(data, name).fill(seq, text) == event(filled, name)


def test_a_frame_needs_a_slot_and_as_many_values_as_slots() -> None:
    with pytest.raises(ValueError, match="at least one SLOT"):
        Frame({"a": 1})
    with pytest.raises(ValueError, match="2 slots, got 1"):
        Frame({"a": SLOT, "b": SLOT}).fill("x")


async def _items(n: int, fail_first: bool = False) -> AsyncIterator[int]:
    if fail_first:
        raise LookupError("before the first item")
    for i in range(n):
        await asyncio.sleep(0)
        yield i


def test_primed_raises_before_the_first_item_and_then_yields_all_in_order() -> None:
    async def run() -> list[int]:
        with pytest.raises(LookupError):
            await primed(_items(3, fail_first=True))
        return [x async for x in await primed(_items(5))]

    assert asyncio.run(run()) == [0, 1, 2, 3, 4]


def test_a_value_holding_the_markers_text_still_gives_the_exact_event() -> None:
    data = {"model": f"a{SLOT}b", "delta": {"content": SLOT}, "n": [SLOT, 1]}
    assert Frame(data).fill("x", 7) == event({"model": f"a{SLOT}b", "delta": {"content": "x"}, "n": [7, 1]})
