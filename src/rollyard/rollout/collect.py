"""Programs and groups: register on the gateway, run (locally or on a Ray worker), fetch the
trajectory from the journal, score the group, turn it into trainer samples.

An engine that dies under a program is restarted and the program re-run under a new id (the
broken attempt stays in the journal as terminated); a hung agent or crashed sandbox ends its
program with that status and the group goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollyard.agents.blackbox import BlackBoxRunner
from rollyard.agents.loop import AgentConfig
from rollyard.core.clock import SystemClock
from rollyard.core.events import Event
from rollyard.core.program import Program, ProgramState, SamplingPolicy
from rollyard.core.sample import Sample
from rollyard.core.trajectory import Trajectory
from rollyard.rl.advantages import group_samples
from rollyard.rl.masks import apply_masks
from rollyard.rl.reward_base import RewardContext
from rollyard.rl.rewards import score_group, with_rewards
from rollyard.rollout.config import Config
from rollyard.rollout.environment import ProgramEnvironment, access_events
from rollyard.rollout.episode import BLACKBOX_EXITED, EpisodeResult, act_and_evaluate
from rollyard.rollout.rewarding import reward_context
from rollyard.rollout.services import Services
from rollyard.rollout.stats import TERMS, event_counts
from rollyard.sandbox.base import Sandbox, SandboxSpec
from rollyard.tasks.model import Task
from rollyard.tasks.sandboxing import sandbox_spec, set_up

log = logging.getLogger(__name__)
_CLOCK = SystemClock()  # event times, as the gateway stamps its own

UNRECOVERABLE = {"sandbox_error", "engine_unavailable"}  # the environment failed, not the policy


def unrecoverable(t: Trajectory) -> bool:
    """The program's environment failed under it (or its evaluation did): no signal about the policy."""
    o = t.outcome
    return o is not None and (o.status == "error" or o.details.get("agent_status") in UNRECOVERABLE)


_CLEAN_END = {"submitted", "final_answer", "max_turns", "context_exceeded", BLACKBOX_EXITED}


class ProgramRunner(Protocol):
    """Runs one registered program's agent and evaluation somewhere; local or Ray."""

    remote: bool  # its agents may run on other machines (they get the gateway's advertised URL)

    async def run(
        self, task: Task, program: Program, base_url: str, agent: AgentConfig | BlackBoxRunner
    ) -> EpisodeResult: ...


class LocalRunner:
    """Agents in this process, sandboxes from the run's pool."""

    remote = False

    def __init__(self, svc: Services, timeout_s: float, env: ProgramEnvironment | None = None) -> None:
        self.svc = svc
        self.timeout_s = timeout_s
        self.env = env
        self._registered: set[str] = set()

    def _spec(self, task: Task, agent: AgentConfig | BlackBoxRunner) -> SandboxSpec:
        """The task's sandbox under the run's ``sandbox.limits``; a black-box agent adds the
        gateway's socket, the forwarder, Python, its CLI and its profile's own limits."""
        spec = sandbox_spec(task, self.svc.provider)
        spec = spec.model_copy(update={"limits": self.svc.cfg.sandbox.program_limits()})
        return agent.spec(spec) if isinstance(agent, BlackBoxRunner) else spec

    def prepare(self, task: Task, agent: AgentConfig | BlackBoxRunner) -> None:
        """Register the task with the sandbox pool once; it starts preparing ``sandbox.ahead``."""
        if task.id in self._registered:
            return
        spec = self._spec(task, agent)
        # prepares ``sandbox.ahead`` sandboxes of this task while its programs wait for a slot
        self.svc.pool.register(task.id, spec, prepare=lambda sb: set_up(task, sb))
        self._registered.add(task.id)

    async def run(
        self, task: Task, program: Program, base_url: str, agent: AgentConfig | BlackBoxRunner
    ) -> EpisodeResult:
        if self.env is not None and self.env.active:
            return await self._run_own(task, program, base_url, agent, self.env)
        self.prepare(task, agent)
        sb = await self.svc.pool.acquire(task.id, program.id)
        try:
            return await self._act(task, sb, program, base_url, agent)
        except BaseException:  # no program.finish follows: free it here
            await self.svc.pool.release(program.id)
            raise
        # on success run_program frees the sandbox once the gateway has finished the program

    async def _run_own(
        self,
        task: Task,
        program: Program,
        base_url: str,
        agent: AgentConfig | BlackBoxRunner,
        env: ProgramEnvironment,
    ) -> EpisodeResult:
        """In a sandbox of the program's own (monitored and/or perturbed)."""
        spec = self._spec(task, agent)
        events: list[Event] = []
        clock = _CLOCK
        async with env.sandbox(task, program, spec, events, clock.now()) as (sb, monitor):
            return await self._act(
                task,
                sb,
                program,
                base_url,
                agent,
                events=events,
                after_agent=lambda box: access_events(monitor, box, clock.now()),
            )

    async def _act(
        self,
        task: Task,
        sb: Sandbox,
        program: Program,
        base_url: str,
        agent: AgentConfig | BlackBoxRunner,
        **extra: Any,
    ) -> EpisodeResult:
        """The agent's episode in ``sb``, then the task's evaluation (one call for both sandbox kinds)."""
        return await act_and_evaluate(
            task,
            sb,
            self.svc.provider,
            base_url=base_url,
            api_key=program.api_key,
            agent=agent,
            timeout_s=min(self.timeout_s, task.spec.timeouts.agent_s),
            **extra,
        )


async def run_program(
    svc: Services,
    runner: ProgramRunner,
    task: Task,
    group_id: str,
    temperature: float,
    retries: int = 3,
    group_size: int = 1,
) -> Trajectory:
    """One program to its recorded, evaluated trajectory (re-run when its engine died)."""
    gw = svc.gateway.client
    cfg = svc.cfg
    sampling = SamplingPolicy(temperature=temperature, top_p=cfg.run.top_p, max_tokens=cfg.agent.max_tokens)
    if isinstance(runner, LocalRunner):  # sandboxes of this task get prepared while it waits for a slot
        runner.prepare(task, svc.agent)
    for attempt in range(retries + 1):
        async with svc.slots:
            program, shard = await gw.create(
                Program(group_id=group_id, group_size=group_size, task_id=task.id, sampling=sampling)
            )
            # its shard's address; a worker on another machine dials the advertised one, not loopback
            url = svc.gateway.url_of(shard, remote=runner.remote)
            agent = svc.agent
            if isinstance(agent, BlackBoxRunner):  # the sandbox's door is its shard's socket
                agent = agent.through(svc.gateway.socket_of(shard) or agent.socket_path)
            res = await runner.run(task, program, url + "/v1", agent)
        if svc.gateway.closing:  # the run is being torn down; its journal is closing
            raise asyncio.CancelledError
        state = ProgramState.FINISHED if res.status in _CLEAN_END else ProgramState.TERMINATED
        await gw.record_events(program.id, res.events)  # the agent's side: tool results, CM
        await gw.finish(program.id, state, res.status, res.outcome)  # after any turn in flight
        svc.pool.on_program_terminated(program.id)  # its sandbox goes now, however it ended
        if res.engine_failed and attempt < retries and cfg.engine.restart_on_death:
            log.warning("program=%s lost its engine; healing and re-running", program.id)
            await svc.fleet.heal()
            await asyncio.sleep(2.0 * (attempt + 1))  # let an overloaded engine drain
            if svc.gateway.closing:  # torn down meanwhile: no re-run on a closed gateway
                raise asyncio.CancelledError
            await gw.refresh()
            continue
        return await gw.trajectory(program.id)
    raise AssertionError("unreachable")


@dataclass
class GroupRecord:
    """A finished, scored group and its samples; what travels through the buffer."""

    group_id: str
    number: int
    task_id: str
    trajectories: list[Trajectory]
    samples: list[Sample]
    policy_version: int
    completion_tokens: int
    stats: dict[str, float] = field(default_factory=dict)


def score(
    group_id: str,
    number: int,
    task: Task,
    trajs: list[Trajectory],
    cfg: Config,
    ctx: RewardContext | None = None,
) -> GroupRecord:
    """Rewards (configured terms, reading ``ctx``) and group-relative advantages, as trainer
    samples; reward-to-go gets each trajectory's per-turn rewards."""
    breakdowns = score_group(trajs, cfg.rewards, ctx)
    scored = with_rewards(trajs, breakdowns)
    keep = [i for i, t in enumerate(scored) if t.num_turns > 0]
    trainable = [scored[i] for i in keep]
    per_turn = [breakdowns[i].per_turn for i in keep]
    samples = group_samples(trainable, cfg.trainer.advantages, turn_rewards=per_turn) if trainable else []
    by_id = {t.id: unrecoverable(t) for t in trainable}
    masked = apply_masks(samples, [by_id[s.trajectory_id] for s in samples], cfg.trainer.masks)
    left_out = sum(
        a.num_loss_tokens > 0 and b.num_loss_tokens == 0 for a, b in zip(samples, masked, strict=True)
    )
    samples = masked
    versions = [v for t in scored for v in t.policy_versions]
    rewards = [t.outcome.reward or 0.0 for t in scored if t.outcome]
    return GroupRecord(
        group_id=group_id,
        number=number,
        task_id=task.id,
        trajectories=scored,
        samples=samples,
        policy_version=min(versions) if versions else 0,
        completion_tokens=sum(t.completion_tokens for t in scored),
        stats={
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "success": statistics.fmean(1.0 if t.outcome and t.outcome.passed else 0.0 for t in scored),
            "turns": statistics.fmean(t.num_turns for t in scored),
            **{f"reward_{k}": statistics.fmean(b.terms[k] for b in breakdowns) for k in TERMS},
            **event_counts(scored),
            "count_masked_samples": float(left_out),
        },
    )


async def run_group(
    svc: Services,
    runner: ProgramRunner,
    task: Task,
    group_id: str,
    number: int,
    size: int,
    temperature: float,
) -> GroupRecord:
    """G programs of one task, concurrently, scored as one group."""
    trajs = list(
        await asyncio.gather(
            *(run_program(svc, runner, task, group_id, temperature, group_size=size) for _ in range(size))
        )
    )
    ctx = await reward_context(svc.judge, task, trajs)
    return score(group_id, number, task, trajs, svc.cfg, ctx)
