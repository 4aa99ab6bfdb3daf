"""SSE framing: a filled frame is the event it stands for; a primed stream raises early and
yields every item in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollyard.gateway.sse import SLOT, Frame, SSEResponse, event, primed

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


def test_a_value_holding_the_old_markers_text_still_gives_the_exact_event() -> None:
    old = "\x00rollyard-slot\x00"  # the marker was this string; a model name equal to it was a 500
    data = {"model": old, "m2": f"a{old}b", "delta": {"content": SLOT}, "n": [SLOT, 1]}
    filled = {"model": old, "m2": f"a{old}b", "delta": {"content": "x"}, "n": [7, 1]}
    assert Frame(data).fill("x", 7) == event(filled)


_LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_JSON = st.recursive(
    _LEAF | st.just(SLOT),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=16,
)


def _filled(data: object, values: list[object]) -> object:
    if data is SLOT:
        return values.pop(0)
    if isinstance(data, dict):
        return {k: _filled(v, values) for k, v in data.items()}
    if isinstance(data, list):
        return [_filled(v, values) for v in data]
    return data


def _count(data: object) -> int:
    if data is SLOT:
        return 1
    if isinstance(data, dict):
        return sum(_count(v) for v in data.values())
    if isinstance(data, list):
        return sum(_count(v) for v in data)
    return 0


@given(st.dictionaries(_TEXT, _JSON, max_size=5), st.data(), st.sampled_from([None, "delta"]))
def test_any_data_with_slots_anywhere_fills_to_its_exact_event(
    data: dict, draw: st.DataObject, name: str | None
) -> None:
    """Client strings of any content (the old marker's text included) are never taken for a slot."""
    data = {**data, "model": "\x00rollyard-slot\x00", "tail": SLOT}
    values = [draw.draw(_LEAF) for _ in range(_count(data))]
    assert Frame(data, name).fill(*values) == event(_filled(data, list(values)), name)


_SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}  # uvicorn's: a send after a disconnect is dropped


async def _never() -> dict[str, str]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_client_that_disconnects_ends_the_stream_and_closes_its_frames() -> None:
    closed = asyncio.Event()
    left = asyncio.Event()
    sent: list[dict] = []

    async def frames() -> AsyncIterator[str]:
        try:
            while True:
                yield "data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    async def receive() -> dict[str, str]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if len(sent) == 3:
            left.set()

    await asyncio.wait_for(SSEResponse(frames())(_SCOPE, receive, send), 5)
    assert closed.is_set()  # the frames' generator was closed where it waited
    assert sent[0]["type"] == "http.response.start" and 3 <= len(sent) <= 4
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_whole_stream_is_sent_in_order_and_leaves_no_watcher() -> None:
    sent: list[dict] = []

    async def frames() -> AsyncIterator[str]:
        for text in ("a", "b", "c"):
            yield text

    async def send(message: dict) -> None:
        sent.append(message)

    before = len(asyncio.all_tasks())
    await SSEResponse(frames())(_SCOPE, _never, send)
    await asyncio.sleep(0)
    assert [m.get("body") for m in sent[1:]] == [b"a", b"b", b"c", b""]
    assert len(asyncio.all_tasks()) == before


async def test_a_cancellation_from_elsewhere_is_not_taken_for_a_disconnect() -> None:
    async def frames() -> AsyncIterator[str]:
        while True:
            yield "x"
            await asyncio.sleep(0.01)

    async def send(message: dict) -> None:
        return None

    task = asyncio.create_task(SSEResponse(frames())(_SCOPE, _never, send))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_shutdown_cancel_during_a_disconnect_still_goes_on_up() -> None:
    """The client leaves and the server cancels the request too: the stream's own cancel is
    taken back, the server's is not lost."""
    left = asyncio.Event()
    waiting = asyncio.Event()

    async def frames() -> AsyncIterator[str]:
        yield "x"
        waiting.set()
        await asyncio.Event().wait()
        yield "never"

    async def receive() -> dict[str, str]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        return None

    task = asyncio.create_task(SSEResponse(frames())(_SCOPE, receive, send))
    await waiting.wait()
    left.set()
    await asyncio.sleep(0)  # the watcher ends: the stream is cancelled for the disconnect
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_disconnect_cancel_the_stream_absorbs_is_taken_back() -> None:
    """A stream that swallows the cancel and ends on its own leaves its task uncancelled (a
    cancel counted on the request's task would upset its later timeouts)."""
    left = asyncio.Event()
    counted: list[int] = []

    async def frames() -> AsyncIterator[str]:
        yield "x"
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        yield "after"

    async def receive() -> dict[str, str]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        left.set()

    async def run() -> None:
        await SSEResponse(frames())(_SCOPE, receive, send)
        counted.append(asyncio.current_task().cancelling())  # type: ignore[union-attr]

    await asyncio.wait_for(run(), 5)
    assert counted == [0]
