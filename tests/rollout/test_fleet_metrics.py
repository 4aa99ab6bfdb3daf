"""The step row's engine counters (``EngineFleet.engine_metrics``): an engine that does not answer
neither fails the step nor hides the others' counts; what it did shows once it answers again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rollyard.core.errors import EngineUnavailable
from rollyard.engines.base import EngineStats
from rollyard.rollout.services import EngineFleet


class Counters:
    """A backend whose stats are set by the test (``down``: it does not answer)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.computed = 0
        self.down = False

    async def stats(self) -> EngineStats:
        if self.down:
            raise EngineUnavailable(f"engine {self.name} unreachable")
        return EngineStats(prompt_tokens_by_source={"local_compute": self.computed})


def test_an_engine_that_does_not_answer_keeps_its_last_read_and_counts_when_back() -> None:
    async def go() -> None:
        e0, e1 = Counters("engine0"), Counters("engine1")
        fleet = EngineFleet([], [e0, e1], Path("w"), 0)  # type: ignore[list-item]
        e0.computed, e1.computed = 100, 40
        assert (await fleet.engine_metrics())["prompt_tokens_computed"] == 140
        e0.computed, e1.computed, e1.down = 150, 90, True
        row = await fleet.engine_metrics()
        assert row["prompt_tokens_by_engine"] == {"engine0": {"computed": 50}, "engine1": {"computed": 0}}
        e1.down = False
        e0.computed, e1.computed = 160, 95
        row = await fleet.engine_metrics()
        assert row["prompt_tokens_by_engine"] == {"engine0": {"computed": 10}, "engine1": {"computed": 55}}

    asyncio.run(go())
