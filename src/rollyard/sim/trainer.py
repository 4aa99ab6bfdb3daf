"""The trainer around the simulated engines: batches through the buffer, steps, publication.

Finished groups go through ``rl.buffer.WindowedFifo`` (its window and staleness bound act as
in training). A step starts once a batch is full (sync mode: once the step's groups are all
in) and lasts the workload's fixed ``train_s``, or, when the profile has a ``trainer`` section,
``6 x params x tokens / (gpus x peak x mfu)`` for the batch's tree-merged tokens (a group's
task prompt once, each member's own tokens after it). Then the weights are published: staged
(``publish.stage_s``), then every engine fenced while it takes them (``publish.fence_s``); the
version changes when the fence lifts. Without a ``publish`` section publication is instant, as
before. The loop owns the events and the engines; this owns the trainer's state and its costs.
"""

from __future__ import annotations

from collections.abc import Callable

from rollyard.core.clock import FakeClock
from rollyard.rl.buffer import WindowedFifo
from rollyard.sim.profile import EngineProfile
from rollyard.sim.stats import SimStats
from rollyard.sim.workload import RLMode, RLSpec

__all__ = ["SimTrainer"]


class SimTrainer:
    def __init__(
        self,
        rl: RLSpec,
        profile: EngineProfile,
        clock: FakeClock,
        stats: SimStats,
        start: Callable[[float], None],
    ) -> None:
        """``start(train_s)``: the loop schedules the step's end ``train_s`` from now."""
        self.rl, self.profile, self.clock, self.stats = rl, profile, clock, stats
        self.buffer = WindowedFifo(rl.buffer, clock)
        self.version = 0
        self.busy = False  # training or publishing
        self._units: set[str] = set()  # the batch's groups (or lone programs)
        self._tokens = 0  # the batch's tree-merged tokens
        self._idle_since = 0.0
        self._own: dict[str, tuple[str, int, int]] = {}  # finished program -> (unit, task prompt, own tokens)
        self._start = start

    def finished(self, program_id: str, unit: str, task_prompt: int, context: int) -> None:
        """A program ended with ``context`` tokens, ``task_prompt`` of them its group's task."""
        self.buffer.complete(program_id, length=context)
        self._own[program_id] = (unit, task_prompt, max(0, context - task_prompt))

    def take(self, step_over: bool, all_done: bool) -> None:
        """Release finished groups into the batch; start a step once it is due."""
        if self.busy:
            return
        got = self.buffer.release(self.version, self.rl.batch_groups)
        for item in got.items:
            unit, task, own = self._own.pop(item.item_id, (item.group_id or item.item_id, 0, 0))
            if unit not in self._units:
                self._units.add(unit)
                self._tokens += task  # the shared task prompt, once per group: the tree's trunk
            self._tokens += own
            self.stats.staleness.append(item.staleness)
        for item in got.dropped:
            self._own.pop(item.item_id, None)
        self.stats.dropped += len(got.dropped)
        if not self._units:
            return
        sync_over = self.rl.mode is RLMode.SYNC and step_over
        if len(self._units) >= self.rl.batch_groups or sync_over or all_done:
            now = self.clock.now()
            self.stats.trainer_idle_s += now - self._idle_since
            cost = self.profile.trainer
            train_s = cost.step_s(self._tokens) if cost is not None else self.rl.train_s
            self.stats.trained_tokens += self._tokens
            self.stats.train_s += train_s
            self.stats.trainer_started += 1
            self.busy = True
            self._units, self._tokens = set(), 0
            self._start(train_s)

    def publish_costs(self, engines: int) -> tuple[float, float]:
        """(stage s, fence s) of the publication after a step (0, 0 without a ``publish`` section)."""
        p = self.profile.publish
        if p is None:
            return 0.0, 0.0
        stage, fence = p.stage_s(), p.fence_s(engines)
        self.stats.publish_s += stage + fence
        self.stats.fence_s += fence
        self.stats.publishes += 1
        return stage, fence

    def published(self) -> None:
        """The fence lifted: the new version is live, the trainer free for the next batch."""
        self.busy = False
        self.version += 1
        self.stats.trainer_steps += 1
        self._idle_since = self.clock.now()
