"""A step's weights reach an engine that died after the rollout: it is restarted, then published to.

The race the engine-death test meets only sometimes (the engine killed while the trainer trains,
so no program met it dead and healed it) made deterministic with stand-ins for the publisher and
the fleet; the real ones are exercised end to end by ``test_engine_death.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollyard.core.errors import TrainError
from rollyard.rollout.services import publish_healing


class Publisher:
    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls = refusals, []

    async def publish(self, model: Any, version: int) -> Path:
        self.calls.append(version)
        if len(self.calls) <= self.refusals:
            raise TrainError(f"engine engine0 refused weights version {version}: unreachable")
        return Path(f"/w/v{version}")


class Fleet:
    def __init__(self, dead: int) -> None:
        self.dead, self.heals = dead, 0

    async def heal(self) -> bool:
        self.heals += 1
        restarted, self.dead = self.dead > 0, 0
        return restarted


async def test_a_dead_engine_is_restarted_and_then_gets_the_weights() -> None:
    pub, fleet = Publisher(refusals=1), Fleet(dead=1)
    assert await publish_healing(pub, fleet, object(), 3) == Path("/w/v3")  # type: ignore[arg-type]
    assert pub.calls == [3, 3] and fleet.heals == 1


async def test_a_refusal_with_nothing_to_restart_fails_the_step() -> None:
    pub, fleet = Publisher(refusals=1), Fleet(dead=0)
    with pytest.raises(TrainError, match="refused weights version 3"):
        await publish_healing(pub, fleet, object(), 3)  # type: ignore[arg-type]
    assert pub.calls == [3]


async def test_a_second_refusal_after_the_restart_fails_the_step() -> None:
    pub, fleet = Publisher(refusals=2), Fleet(dead=1)
    with pytest.raises(TrainError):
        await publish_healing(pub, fleet, object(), 3)  # type: ignore[arg-type]
    assert pub.calls == [3, 3] and fleet.heals == 1


async def test_a_healthy_publish_does_not_touch_the_fleet() -> None:
    pub, fleet = Publisher(refusals=0), Fleet(dead=1)
    assert await publish_healing(pub, fleet, object(), 2) == Path("/w/v2")  # type: ignore[arg-type]
    assert fleet.heals == 0
