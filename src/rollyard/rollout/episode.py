"""One program, start to end: agent in a sandbox against the gateway, then the hidden tests.

``act_and_evaluate`` is what a rollout worker does (locally, or inside a Ray actor): run the
agent with a hard timeout, then score the final workspace in a fresh sandbox. The agent is the
white-box tool loop (an ``AgentConfig``: it runs here and calls the gateway over HTTP) or an
unmodified CLI run inside the sandbox (a ``BlackBoxRunner``: it reaches the gateway only through
its unix socket). A hung agent is cut off and scored as it stands (status ``timeout``); a
sandbox failure is recorded (status ``sandbox_error``), never raised, so one bad program cannot
stop a run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from rollyard.agents.blackbox import BlackBoxRunner
from rollyard.agents.loop import AgentConfig, ExitReason, WhiteBoxAgent
from rollyard.core.errors import RollyardError
from rollyard.core.events import Event
from rollyard.core.trajectory import Outcome
from rollyard.sandbox.base import Sandbox, SandboxProvider
from rollyard.tasks.evaluate import evaluate
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)

ENGINE_FAILURE = "engine_unavailable"
BLACKBOX_EXITED = "exited"  # a black-box agent's process ended with status 0
BLACKBOX_FAILED = "agent_error"  # ... or with another status
MODEL_NAME = "policy"  # what the run's gateway serves
STDERR_TAIL = 1500  # characters of a black-box agent's stderr kept in its outcome

AfterAgent = Callable[[Sandbox], Awaitable[list[Event]]]


class EpisodeResult(BaseModel):
    """What a worker reports back: how the agent ended and what the hidden tests said."""

    model_config = ConfigDict(extra="forbid")

    status: str  # the agent's exit reason, "timeout", "sandbox_error" or "engine_unavailable"
    outcome: Outcome
    turns: int = 0
    error: str | None = None
    events: list[Event] = Field(default_factory=list)  # the agent's (tool results, CM rewrites)

    @property
    def engine_failed(self) -> bool:
        return self.status == ENGINE_FAILURE


def _engine_error(error: str | None) -> bool:
    text = (error or "").lower()
    return any(
        k in text for k in ("engine_unavailable", "503", "502", "connection error", "no healthy engine")
    )


async def _whitebox(
    task: Task,
    sandbox: Sandbox,
    base_url: str,
    api_key: str,
    agent: AgentConfig,
    timeout_s: float,
    events: list[Event],
) -> tuple[str, int, str | None]:
    """Runs the tool loop; its events land in ``events`` as they happen, so a timeout keeps them."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
    try:
        result = await asyncio.wait_for(
            WhiteBoxAgent(client, agent).run(task.spec.instruction, sandbox, events=events), timeout_s
        )
    finally:
        await client.close()
    status = result.exit_reason.value
    if result.exit_reason == ExitReason.ERROR and _engine_error(result.error):
        status = ENGINE_FAILURE
    return status, result.turns, result.error


async def _blackbox(
    task: Task, sandbox: Sandbox, api_key: str, runner: BlackBoxRunner, timeout_s: float
) -> tuple[str, int, str | None, dict[str, object]]:
    """The CLI's own timeout is the profile's; the episode's is the tighter bound around it.
    Its exit status and the tail of its stderr go to the outcome and, when it failed, the log."""
    res = await asyncio.wait_for(
        runner.run(sandbox, task=task.spec.instruction, api_key=api_key, model=MODEL_NAME), timeout_s
    )
    if res.timed_out:
        raise TimeoutError
    details: dict[str, object] = {"agent_rc": res.rc, "agent_stderr": res.stderr[-STDERR_TAIL:]}
    if res.rc == 0:
        return BLACKBOX_EXITED, 0, None, details
    tail = res.stderr[-STDERR_TAIL:].strip()
    log.warning("task=%s agent %s exited rc=%d: %s", task.id, runner.profile.name, res.rc, tail[-300:])
    error = f"{runner.profile.name} exited with status {res.rc}: {tail}"
    return (ENGINE_FAILURE if _engine_error(res.stderr[-2000:]) else BLACKBOX_FAILED), 0, error, details


async def act_and_evaluate(
    task: Task,
    sandbox: Sandbox,
    provider: SandboxProvider,
    *,
    base_url: str,
    api_key: str,
    agent: AgentConfig | BlackBoxRunner,
    timeout_s: float,
    events: list[Event] | None = None,
    after_agent: AfterAgent | None = None,
) -> EpisodeResult:
    """Run the agent in ``sandbox`` (cut off after ``timeout_s``), then evaluate the workspace.

    ``events`` may already hold the environment's own (a perturbation); ``after_agent`` looks at
    the sandbox once the agent stopped and before evaluation copies it (test-access checks)."""
    status, turns, error = "timeout", 0, None
    agent_details: dict[str, object] = {}
    events = [] if events is None else events
    try:
        if isinstance(agent, BlackBoxRunner):
            status, turns, error, agent_details = await _blackbox(task, sandbox, api_key, agent, timeout_s)
        else:
            status, turns, error = await _whitebox(task, sandbox, base_url, api_key, agent, timeout_s, events)
    except TimeoutError:
        log.warning("task=%s agent hung past %.0f s; terminated", task.id, timeout_s)
    except RollyardError as e:
        status, error = "sandbox_error", e.message
    if after_agent is not None:
        events += await after_agent(sandbox)
    if error:
        agent_details["agent_error"] = error[-STDERR_TAIL:]
    if status == ENGINE_FAILURE:
        return EpisodeResult(
            status=status,
            outcome=Outcome(status="error", passed=False, details=agent_details),
            turns=turns,
            error=error,
            events=events,
        )
    try:
        outcome = await evaluate(task, sandbox, provider)
    except RollyardError as e:
        outcome = Outcome(status="error", passed=False, pass_fraction=0.0, details={"error": e.message})
    outcome.details.update(agent_details, agent_status=status)
    return EpisodeResult(status=status, outcome=outcome, turns=turns, error=error, events=events)
