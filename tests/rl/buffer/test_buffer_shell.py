"""The asyncio and thread shells: waiting gets, wake-ups, timeouts, close."""

from __future__ import annotations

import asyncio
import threading

from rollyard.rl.buffer import AsyncBuffer, BufferConfig, ThreadSafeBuffer


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


def test_threaded_producers_and_a_blocking_consumer_lose_nothing() -> None:
    buf = ThreadSafeBuffer(BufferConfig(window_fraction=0.5))
    n_threads, per_thread = 4, 50

    def produce(t: int) -> None:
        for i in range(per_thread):
            buf.submit(f"{t}-{i}")
            buf.complete(f"{t}-{i}", length=i)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    seen: list[str] = []
    total = n_threads * per_thread
    while len(seen) < total:
        seen.extend(r.item_id for r in buf.get(0, min(16, total - len(seen)), timeout=5).items)
    for th in threads:
        th.join()
    assert sorted(seen) == sorted(f"{t}-{i}" for t in range(n_threads) for i in range(per_thread))


def test_threaded_get_times_out_with_what_is_ready() -> None:
    buf = ThreadSafeBuffer(BufferConfig(rule="fifo"))
    buf.submit("a")
    buf.submit("b")
    buf.complete("b")
    assert buf.get(0, 1, timeout=0.05).items == []
    buf.close()
    assert buf.get(0, 1).items == []
