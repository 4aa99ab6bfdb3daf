"""The asyncio and thread shells: waiting gets, wake-ups, timeouts, close."""

from __future__ import annotations

import asyncio

from rollyard.rl.buffer import AsyncBuffer, BufferConfig


async def test_async_get_waits_until_enough_items_complete() -> None:
    buf = AsyncBuffer(BufferConfig(window=4))
    for i in range(3):
        await buf.submit(f"t{i}", payload=i)
    waiter = asyncio.create_task(buf.get(0, 2))
    await asyncio.sleep(0)
    await buf.complete("t1")
    await asyncio.sleep(0)
    assert not waiter.done()
    await buf.complete("t0")
    got = await asyncio.wait_for(waiter, 5)
    assert [r.payload for r in got.items] == [1, 0]


async def test_async_get_counts_whole_groups_as_units() -> None:
    buf = AsyncBuffer(BufferConfig(window=4, group_whole=True))
    for g in range(2):
        for k in range(3):
            await buf.submit(f"g{g}-{k}", group_id=f"g{g}", group_size=3)
            await buf.complete(f"g{g}-{k}")
    got = await buf.get(0, 2, timeout=5)
    assert len(got.items) == 6


async def test_async_get_returns_partial_batch_on_timeout_and_close() -> None:
    buf = AsyncBuffer(BufferConfig(window=4))
    await buf.submit("a")
    await buf.submit("b")
    await buf.complete("a")
    got = await buf.get(0, 2, timeout=0.05)
    assert [r.item_id for r in got.items] == ["a"]
    waiter = asyncio.create_task(buf.get(0, 1))
    await asyncio.sleep(0)
    await buf.close()
    assert (await asyncio.wait_for(waiter, 5)).items == []
    assert len(buf.core) == 1  # b is still queued, not lost


async def test_async_discard_wakes_a_waiter_with_the_drop() -> None:
    buf = AsyncBuffer(BufferConfig(window=2))
    await buf.submit("a")
    await buf.submit("b")
    waiter = asyncio.create_task(buf.get(0, 1))
    await asyncio.sleep(0)
    await buf.discard("a")
    await buf.complete("b")
    got = await asyncio.wait_for(waiter, 5)
    assert [r.item_id for r in got.items] == ["b"] and [d.item_id for d in got.dropped] == ["a"]


async def test_a_stale_drop_returns_the_get_early_so_the_caller_can_replace_it() -> None:
    # The trainer wants 2; one of the 2 completed items is too stale. Waiting on would deadlock
    # a producer that only makes a replacement once it hears of the drop.
    buf = AsyncBuffer(BufferConfig(window=4, max_staleness=0))
    await buf.submit("old", policy_version=0)
    await buf.submit("new", policy_version=1)
    await buf.complete("old", policy_version=0)
    await buf.complete("new", policy_version=1)
    got = await asyncio.wait_for(buf.get(1, 2), 5)
    assert [r.item_id for r in got.items] == ["new"] and [d.item_id for d in got.dropped] == ["old"]
