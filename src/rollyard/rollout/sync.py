"""Synchronous RL (``run.mode: sync``), the setting Seer targets:

    for each step:
        roll out all of the step's groups under the current weights (every program at once)
        train on them; publish the weights; only then start the next step's groups

The trainer side is the async loop's own ``_step``; only the producer differs. It claims a
step's groups together and waits for the trainer to publish before claiming more, so every
sample is on-policy (staleness 0) and the rollout's long tail is on the critical path: what
divided rollout and the ``seer`` scheduling policy shorten.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from rollyard.rollout.ledger import group_id, task_for

if TYPE_CHECKING:
    from rollyard.rollout.loop import TrainingLoop

log = logging.getLogger(__name__)


async def produce_in_steps(loop: TrainingLoop) -> None:
    """Run each step's groups as one batch; a failed or empty group is replaced in the same step."""
    run = loop.cfg.run
    while loop.s.step < run.steps:
        step, done = loop.s.step, 0
        while done < run.groups_per_step:
            claimed = [loop.s.ledger.claim() for _ in range(run.groups_per_step - done)]
            for n in claimed:
                await loop.buffer.submit(
                    group_id(n), group_id=group_id(n), group_size=1, policy_version=loop.s.version
                )
            results = await asyncio.gather(
                *(loop._one_group(n, group_id(n), task_for(n, loop.train_tasks, run.seed)) for n in claimed)
            )
            done += sum(1 for ok in results if ok)
            log.info("sync step=%d groups_done=%d/%d", step + 1, done, run.groups_per_step)
        while loop.s.step == step:  # the trainer takes them, trains, publishes
            loop._slot.clear()
            await loop._slot.wait()
