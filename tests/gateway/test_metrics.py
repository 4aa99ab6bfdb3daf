"""The gateway's own metrics: the event-loop lag probe, in the running app and against a blocked loop."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi.testclient import TestClient

from rollyard.gateway.metrics import GatewayMetrics, watch_loop_lag

from .conftest import ADMIN

LAG = "rollyard_gateway_loop_lag_seconds"


def test_the_running_app_exports_its_event_loop_lag(client: TestClient) -> None:
    time.sleep(0.5)  # the probe wakes every 0.1 s on the app's loop (started by the lifespan)
    text = client.get("/metrics", headers={"x-api-key": ADMIN}).text
    count = next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(f"{LAG}_count"))
    assert count >= 2, text
    assert f'{LAG}_bucket{{le="0.005"}}' in text


def test_the_probe_measures_how_long_the_loop_was_blocked() -> None:
    m = GatewayMetrics()

    async def main() -> None:
        probe = asyncio.create_task(watch_loop_lag(m, 0.02))
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # blocks the loop, as a CPU-bound step on it would
        await asyncio.sleep(0.1)
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe

    asyncio.run(main())
    value = m.registry.get_sample_value
    total = value(f"{LAG}_count")
    assert total is not None and total >= 5
    # Exactly the wake-up that the block delayed is late by ~0.28 s; the others are not.
    assert value(f"{LAG}_bucket", {"le": "0.1"}) == total - 1
    assert value(f"{LAG}_bucket", {"le": "0.5"}) == total
    assert 0.25 <= (value(f"{LAG}_sum") or 0) < 0.25 + 0.1 * total
    p99, worst = m.lag_since_last_read()  # what a run's step row reports, then starts afresh
    assert 0.25 <= worst < 0.5 and p99 <= worst
    assert m.lag_since_last_read() == (0.0, 0.0)
