"""The training loop, as the algorithm reads:

    while step < steps:
        groups  <- buffer.get(G groups the staleness bound allows)    # produced concurrently
        samples <- advantages(rewards(groups))
        trainer.step(samples); publish weights as version step+1 to every engine
        record trajectories, metrics, checkpoint (weights + group ledger, atomically)

and, concurrently, the producer: claim the next group number, run its G programs, score them,
put the group in the buffer. Rollouts never wait for training; the buffer drops groups whose
policy lags the trainer by more than ``buffer.max_staleness`` (recorded in the ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import WorkerLost
from rollyard.core.tables import write_parquet
from rollyard.rl.buffer.shell import AsyncBuffer
from rollyard.rollout.collect import GroupRecord, ProgramRunner, run_group, unrecoverable
from rollyard.rollout.config import Config
from rollyard.rollout.evaluation import heldout
from rollyard.rollout.ledger import GroupLedger, group_id, task_for
from rollyard.rollout.loggers import open_trackers
from rollyard.rollout.rundir import RunDir
from rollyard.rollout.services import Services, publish_healing
from rollyard.rollout.silence import SilentPrograms
from rollyard.rollout.stats import step_stats
from rollyard.rollout.sync import produce_in_steps
from rollyard.rollout.threads import in_daemon_thread
from rollyard.tasks.model import Task
from rollyard.train.draft_online import OnlineHead
from rollyard.train.publish import WeightPublisher
from rollyard.train.trainer import Trainer

log = logging.getLogger(__name__)

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class LoopState:
    step: int
    version: int
    ledger: GroupLedger
    failures: int = 0  # groups that raised and were dropped
    draft_head: dict[str, Any] | None = None  # a resumed run's online draft head, from its checkpoint


class TrainingLoop:
    def __init__(
        self,
        cfg: Config,
        run: RunDir,
        svc: Services,
        runner: ProgramRunner,
        trainer: Trainer,
        publisher: WeightPublisher,
        train_tasks: list[Task],
        held_out: list[Task],
        state: LoopState,
        *,
        clock: Clock | None = None,
        progress: ProgressFn | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.svc, self.runner = cfg, run, svc, runner
        self.trainer, self.publisher = trainer, publisher
        self.train_tasks, self.held_out = train_tasks, held_out
        self.s = state
        self.clock = clock or SystemClock()
        self.progress = progress or (lambda _row: None)
        self.buffer = AsyncBuffer(cfg.buffer, self.clock)
        self._slot = asyncio.Event()
        self._groups: set[asyncio.Task[None]] = set()
        self.silent = SilentPrograms(cfg.agent.max_silent_programs)
        self.trackers = open_trackers(cfg.run.loggers, run.root, cfg.model_dump(mode="json"))
        self._fatal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.draft_head: OnlineHead | None = None  # engine.drafting eagle, online

    # -- producer ------------------------------------------------------------------------------
    def _wanted(self) -> int:
        left = (self.cfg.run.steps - self.s.step) * self.cfg.run.groups_per_step
        return min(self.cfg.run.max_groups_in_flight, left)

    async def _produce(self) -> None:
        while True:
            while self.s.ledger.in_flight() >= self._wanted():
                self._slot.clear()
                await self._slot.wait()
            n = self.s.ledger.claim()
            gid = group_id(n)
            await self.buffer.submit(gid, group_id=gid, group_size=1, policy_version=self.s.version)
            task = asyncio.create_task(
                self._one_group(n, gid, task_for(n, self.train_tasks, self.cfg.run.seed))
            )
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    async def _one_group(self, n: int, gid: str, task: Task) -> bool:
        """Run, score and hand one group to the buffer; False when it was dropped instead."""
        run = self.cfg.run
        try:
            rec = await run_group(self.svc, self.runner, task, gid, n, run.group_size, run.temperature)
        except asyncio.CancelledError:
            raise
        except WorkerLost as e:  # a node went: stop the run; the group is re-issued on --resume
            log.error("group=%s: %s", gid, e.message)
            if not self._fatal.done():
                self._fatal.set_exception(e)
            return False
        except Exception:
            log.exception("group=%s task=%s failed; dropping it", gid, task.id)
            self.s.failures += 1
            await self.buffer.discard(gid)
            return False
        # programs whose environment failed (engine gone, sandbox error) say nothing about the agent
        self.silent.observe(t for t in rec.trajectories if not unrecoverable(t))
        if self.silent.tripped and not self._fatal.done():
            self._fatal.set_exception(self.silent.error())  # the trainer's wait raises it
        if not rec.samples:
            await self.buffer.discard(gid)
            return False
        await self.buffer.complete(
            gid, policy_version=rec.policy_version, length=rec.completion_tokens, payload=rec
        )
        self.progress(
            {"event": "group", "reward": rec.stats["reward_mean"], "in_flight": self.s.ledger.in_flight()}
        )
        return True

    # -- trainer -------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        if self.s.step == 0 and self.held_out and not self.run_dir.read_metrics():
            row = {"step": 0, "policy_version": self.s.version, **await self._evaluate("step0")}
            self._append(row)
            self.progress(row)
        sync = self.cfg.run.mode == "sync"  # whole steps: roll out, train, publish (rollout/sync.py)
        producer = asyncio.create_task(produce_in_steps(self) if sync else self._produce())
        last = self.clock.now()
        try:
            while self.s.step < self.cfg.run.steps:
                row = await self._until_fatal(self._step(last))
                last = self.clock.now()
                self.progress(row)
        finally:
            if self._fatal.done():  # retrieved, so asyncio does not log it again at exit
                self._fatal.exception()
            producer.cancel()
            for t in list(self._groups):
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(producer, *self._groups, return_exceptions=True)
            self.trackers.close()
        return self.run_dir.read_metrics()[-1] if self.run_dir.read_metrics() else {}

    async def _until_fatal(self, step: Any) -> dict[str, Any]:
        """Await one step, unless the producer finds the run cannot go on (raised here)."""
        task = asyncio.ensure_future(step)
        await asyncio.wait({task, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done() and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._fatal.result()  # raises the producer's error
        return task.result()

    async def _take(self) -> list[GroupRecord]:
        want = self.cfg.run.groups_per_step
        groups: list[GroupRecord] = []
        while len(groups) < want:
            rel = await self.buffer.get(self.s.version, want - len(groups))
            for d in rel.dropped:
                self.s.ledger.mark_dropped(int(d.item_id[1:]), d.reason)
            groups += [r.payload for r in rel.items]
            self._slot.set()
        return groups

    async def _step(self, last: float) -> dict[str, Any]:
        """take -> train -> publish -> record."""
        t0 = self.clock.now()
        groups = await self._take()
        t1 = self.clock.now()
        # From the step until its publish the model is not the live version: a catch-up (an
        # engine restarted meanwhile) waits, so it never sends weights under the wrong version.
        async with self.publisher.changing_model():
            samples = [s for g in groups for s in g.samples]
            m = await in_daemon_thread(self.trainer.train_step, samples)
            t2 = self.clock.now()
            # the eagle draft head's step, on the policy just updated (``train.draft_online``);
            # before the publish, which carries the head with the version
            head = await in_daemon_thread(self.draft_head.step, samples) if self.draft_head else {}
            t_head = self.clock.now()
            await self._publish(groups)
        row = self._record(groups, m, last=last, took=(t0, t1, t2, t_head, self.clock.now()))
        if self.draft_head:
            row["draft_head_s"] = t_head - t2  # not in train_s or publish_s
        row.update(head)
        row.update(await self._gateway_counts())
        row.update(await self.svc.fleet.engine_metrics())
        last_step = self.s.step == self.cfg.run.steps
        if self.held_out and (self.s.step % self.cfg.eval.every == 0 or last_step):
            row.update(await self._evaluate(f"step{self.s.step}"))
        self._append(row)
        if self.s.step % self.cfg.run.checkpoint_every == 0 or last_step:
            await self.save()
        return row

    async def _publish(self, groups: list[GroupRecord]) -> None:
        """The trained weights become version step+1 on every engine; the groups are spent."""
        version = self.s.version + 1
        path = await publish_healing(self.publisher, self.svc.fleet, self.trainer.model, version)
        if path is not None:  # disk mode: a restarted engine comes back on this dir
            self.svc.fleet.live(path, version)
        self.svc.gateway.note_versions(self.svc.fleet.backends)  # for a gateway shard restarted later
        self.s.version, self.s.step = version, self.s.step + 1
        for g in groups:
            self.s.ledger.mark_trained(g.number, self.s.step)
        self._slot.set()

    def _record(
        self,
        groups: list[GroupRecord],
        m: dict[str, Any],
        *,
        last: float,
        took: tuple[float, float, float, float, float],
    ) -> dict[str, Any]:
        """The step's trajectories to Parquet, and its metrics row."""
        t0, t1, t2, t_head, t3 = took
        trajs = [t for g in groups for t in g.trajectories]
        write_parquet(self.run_dir.trajectory_file(self.s.step), trajs)
        wall = max(self.clock.now() - last, 1e-9)
        tokens = sum(g.completion_tokens for g in groups)
        version = self.s.version
        stats = step_stats([g.stats for g in groups])
        return {
            "step": self.s.step,
            "policy_version": version,
            "reward_mean": stats.pop("reward_mean"),
            "success_rate": stats.pop("success"),
            "turns_per_episode": statistics.fmean(t.num_turns for t in trajs),
            "tokens_per_s": tokens / wall,
            "completion_tokens": tokens,
            "staleness": statistics.fmean(max(0, version - 1 - g.policy_version) for g in groups),
            "trainer_idle_fraction": (t1 - t0) / wall,
            "train_s": t2 - t1,
            "publish_s": t3 - t_head,  # weights sent (memory) or saved and reloaded (disk), all engines
            **{f"publish_{k}": v for k, v in self.publisher.last.items()},
            "wall_s": wall,
            "loss": m.get("loss"),
            **{f"train_{k}": v for k, v in m.items() if k not in ("loss", "step")},
            **{k: v for k, v in stats.items() if k != "turns"},
            **self._judge_counts(),
            "groups": [g.group_id for g in groups],
            "dropped_total": len(self.s.ledger.dropped),
            "failed_groups_total": self.s.failures,
            "engine_restarts": self.svc.fleet.restarts,
            **self._sandbox_counts(),
            "time": time.time(),
        }

    def _append(self, row: dict[str, Any]) -> None:
        """The row to the run's JSONL (what --resume reads), then to every configured tracker."""
        self.run_dir.append_metrics(row)
        self.trackers.log(row)

    def _sandbox_counts(self) -> dict[str, int]:
        """Sandbox hooks carried out so far (program-aware scheduling)."""
        pool = self.svc.pool.stats
        return {"sandbox_hook_releases": pool.hook_releases, "sandbox_ahead_hits": pool.ahead_hits}

    async def _gateway_counts(self) -> dict[str, Any]:
        """The scheduler's decisions so far, and the gateway's event-loop lag over the step
        (its own process: a training step must not show in it)."""
        g = await self.svc.gateway.client.engines()
        return {
            **{f"sched_{k}": v for k, v in g["counts"].items()},
            "gateway_loop_lag_p99_ms": g["loop_lag_p99_ms"],
            "gateway_loop_lag_max_ms": g["loop_lag_max_ms"],
        }

    def _judge_counts(self) -> dict[str, int]:
        j = self.svc.judge
        return {} if j is None else {"judge_calls": j.calls, "judge_unreadable": j.unreadable}

    async def save(self) -> None:
        """Checkpoint in a thread, as a train step runs: the gateway's loop keeps serving."""
        extra: dict[str, Any] = {
            "ledger": self.s.ledger.state_dict(),
            "version": self.s.version,
            "step": self.s.step,
        }
        if self.draft_head is not None:  # its weights and AdamW state, restored on --resume
            extra["draft_head"] = self.draft_head.state_dict()
        await in_daemon_thread(self.trainer.save, self.run_dir.checkpoint, extra_state=extra)

    async def _evaluate(self, tag: str) -> dict[str, Any]:
        e = self.cfg.eval
        return await heldout(self.svc, self.runner, self.held_out, e.samples, e.temperature, tag)
