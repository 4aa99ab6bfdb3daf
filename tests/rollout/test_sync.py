"""``produce_in_steps`` against a fake loop: whole steps, a barrier at each publish, replacements."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rollyard.rollout.ledger import GroupLedger
from rollyard.rollout.sync import produce_in_steps


class FakeLoop:
    """The parts of ``TrainingLoop`` the sync producer touches; the trainer is a coroutine here."""

    def __init__(self, steps: int, per_step: int, fail: set[int] | None = None) -> None:
        self.cfg = SimpleNamespace(run=SimpleNamespace(steps=steps, groups_per_step=per_step, seed=0))
        self.s = SimpleNamespace(step=0, version=0, ledger=GroupLedger())
        self.buffer = SimpleNamespace(submit=self._submit)
        self.train_tasks = ["t"]
        self._slot = asyncio.Event()
        self.fail = fail or set()
        self.log: list[tuple[str, Any]] = []
        self.ready: list[int] = []

    async def _submit(self, gid: str, **_: Any) -> None:
        self.log.append(("claim", gid))

    async def _one_group(self, n: int, gid: str, task: Any) -> bool:
        await asyncio.sleep(0.001 * (n % 3))
        self.log.append(("rolled", (n, self.s.version)))
        if n in self.fail:
            return False
        self.ready.append(n)
        self._slot.set()
        return True

    async def trainer(self) -> None:
        while self.s.step < self.cfg.run.steps:
            while len(self.ready) < self.cfg.run.groups_per_step:
                self._slot.clear()
                await self._slot.wait()
            self.ready = self.ready[self.cfg.run.groups_per_step :]
            await asyncio.sleep(0.01)  # training
            self.s.step += 1
            self.s.version += 1
            self.log.append(("published", self.s.version))
            self._slot.set()


async def test_each_step_is_rolled_out_whole_then_trained_then_published() -> None:
    loop = FakeLoop(steps=3, per_step=2)
    await asyncio.wait_for(asyncio.gather(produce_in_steps(loop), loop.trainer()), 5)  # type: ignore[arg-type]
    rolled = [x for k, x in loop.log if k == "rolled"]
    assert [v for _, v in rolled] == [0, 0, 1, 1, 2, 2]
    assert [x for k, x in loop.log if k == "published"] == [1, 2, 3]


async def test_a_dropped_group_is_replaced_within_its_step() -> None:
    loop = FakeLoop(steps=1, per_step=2, fail={1})
    await asyncio.wait_for(asyncio.gather(produce_in_steps(loop), loop.trainer()), 5)  # type: ignore[arg-type]
    assert [x for k, x in loop.log if k == "rolled"] == [(0, 0), (1, 0), (2, 0)]
    assert loop.s.step == 1
