"""What the reward terms need beyond the trajectories, gathered before a group is scored.

Terms are pure and synchronous; the judge is a network call. So the run asks the judge here,
concurrently for the group's trajectories, and hands the scores to the terms in the
``RewardContext`` together with the task's own completion-time baseline. The judge goes through
the one shared ``ChatClient``; with ``rewards.judge.base_url: gateway`` it is the run's own
gateway, each judgement a program of its own (group ``judge``, never trained).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rollyard.core.errors import DataError
from rollyard.core.program import Program, ProgramState, SamplingPolicy
from rollyard.core.trajectory import Trajectory
from rollyard.engines.chat import ChatClient
from rollyard.rl.judge import TranscriptJudge
from rollyard.rl.reward_base import RewardContext, transcript
from rollyard.rl.rewards import JudgeSettings
from rollyard.rollout.gateway_client import GatewayClient
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)

JUDGE_GROUP = "judge"


@dataclass
class RunJudge:
    """The configured judge and how it reaches its endpoint."""

    settings: JudgeSettings
    base_url: str
    gateway: GatewayClient | None  # set when judging through the run's own gateway
    calls: int = 0
    unreadable: int = 0

    async def _ask_once(
        self, messages: list[dict[str, str]], api_key: str | None, base_url: str | None = None
    ) -> str:
        s = self.settings
        client = ChatClient(base_url or self.base_url, api_key=api_key, timeout_s=s.timeout_s)
        try:
            return await client.complete(
                messages,
                model=s.model,
                temperature=s.temperature,
                max_tokens=s.max_tokens,
                forced_tool=s.score_tool() if s.forced_score else None,
            )
        finally:
            await client.aclose()

    async def ask(self, messages: list[dict[str, str]]) -> str:
        self.calls += 1
        if self.gateway is None:
            return await self._ask_once(messages, self.settings.api_key)
        free = SamplingPolicy(temperature=None, top_p=None, max_tokens=None)  # the judge's own asks
        program, shard = await self.gateway.create(
            Program(group_id=JUDGE_GROUP, task_id=JUDGE_GROUP, sampling=free)
        )
        try:
            return await self._ask_once(messages, program.api_key, self.gateway.urls[shard] + "/v1")
        finally:
            with contextlib.suppress(Exception):  # the run may be closing under us
                await self.gateway.finish(program.id, ProgramState.FINISHED, "judged")

    async def judge_group(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        judge = TranscriptJudge(self.ask, scale=self.settings.scale)

        async def one(t: Trajectory) -> float:
            try:
                return await judge.score(transcript(t))
            except DataError as e:
                if self.settings.on_unreadable == "fail":
                    raise
                self.unreadable += 1
                log.info("judge reply unreadable for %s (scored 0): %s", t.id, e.message)
                return 0.0

        scores = await asyncio.gather(*(one(t) for t in trajectories))
        return {t.id: s for t, s in zip(trajectories, scores, strict=True)}


def make_judge(settings: JudgeSettings | None, gateway: GatewayClient, gateway_url: str) -> RunJudge | None:
    """The run's judge (None when no judge is configured)."""
    if settings is None:
        return None
    own = settings.base_url == "gateway"
    return RunJudge(settings, gateway_url + "/v1" if own else settings.base_url, gateway if own else None)


async def reward_context(
    judge: RunJudge | None, task: Task, trajectories: Sequence[Trajectory]
) -> RewardContext:
    """Judge scores (when a judge is configured) and the task's ``metadata.baseline_s``."""
    baseline = task.spec.metadata.get("baseline_s")
    judged = await judge.judge_group(trajectories) if judge is not None else {}
    return RewardContext(judged=judged, baseline_s=float(baseline) if baseline is not None else None)
