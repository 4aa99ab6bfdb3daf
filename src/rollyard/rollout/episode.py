"""One program, start to end: agent in a sandbox against the gateway, then the hidden tests.

``act_and_evaluate`` is what a rollout worker does (locally, or inside a Ray actor): run the
white-box agent with a hard timeout, then score the final workspace in a fresh sandbox. A hung
agent is cut off and scored as it stands (status ``timeout``); a sandbox failure is recorded
(status ``sandbox_error``), never raised, so one bad program cannot stop a run.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, ConfigDict

from rollyard.agents.loop import AgentConfig, ExitReason, WhiteBoxAgent
from rollyard.core.errors import RollyardError
from rollyard.core.trajectory import Outcome
from rollyard.sandbox.base import Sandbox, SandboxProvider
from rollyard.tasks.evaluate import evaluate
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)

ENGINE_FAILURE = "engine_unavailable"


class EpisodeResult(BaseModel):
    """What a worker reports back: how the agent ended and what the hidden tests said."""

    model_config = ConfigDict(extra="forbid")

    status: str  # the agent's exit reason, "timeout", "sandbox_error" or "engine_unavailable"
    outcome: Outcome
    turns: int = 0
    error: str | None = None

    @property
    def engine_failed(self) -> bool:
        return self.status == ENGINE_FAILURE


def _engine_error(error: str | None) -> bool:
    text = (error or "").lower()
    return any(
        k in text for k in ("engine_unavailable", "503", "502", "connection error", "no healthy engine")
    )


async def act_and_evaluate(
    task: Task,
    sandbox: Sandbox,
    provider: SandboxProvider,
    *,
    base_url: str,
    api_key: str,
    agent: AgentConfig,
    timeout_s: float,
) -> EpisodeResult:
    """Run the agent in ``sandbox`` (cut off after ``timeout_s``), then evaluate the workspace."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
    runner = WhiteBoxAgent(client, agent)
    status, turns, error = "timeout", 0, None
    try:
        result = await asyncio.wait_for(runner.run(task.spec.instruction, sandbox), timeout_s)
        status, turns, error = result.exit_reason.value, result.turns, result.error
        if result.exit_reason == ExitReason.ERROR and _engine_error(result.error):
            status = ENGINE_FAILURE
    except TimeoutError:
        log.warning("task=%s agent hung past %.0f s; terminated", task.id, timeout_s)
    except RollyardError as e:
        status, error = "sandbox_error", e.message
    finally:
        await client.close()
    if status == ENGINE_FAILURE:
        return EpisodeResult(
            status=status, outcome=Outcome(status="error", passed=False), turns=turns, error=error
        )
    try:
        outcome = await evaluate(task, sandbox, provider)
    except RollyardError as e:
        outcome = Outcome(status="error", passed=False, pass_fraction=0.0, details={"error": e.message})
    outcome.details["agent_status"] = status
    return EpisodeResult(status=status, outcome=outcome, turns=turns, error=error)
