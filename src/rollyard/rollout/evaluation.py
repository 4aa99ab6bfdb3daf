"""Held-out success: every held-out task, ``samples`` programs each, at the eval temperature.

Held-out programs run on the same engines and gateway as training (their group ids start with
``eval-``), and are never put in the buffer.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from rollyard.rollout.collect import ProgramRunner, run_program
from rollyard.rollout.services import Services
from rollyard.rollout.stats import first_call_stats
from rollyard.tasks.model import Task


async def heldout(
    svc: Services, runner: ProgramRunner, tasks: list[Task], samples: int, temperature: float, tag: str
) -> dict[str, Any]:
    """Success rate and mean turns over the held-out set."""
    jobs = [
        run_program(svc, runner, t, f"eval-{tag}-{t.id}", temperature) for t in tasks for _ in range(samples)
    ]
    trajs = await asyncio.gather(*jobs)
    passed = [1.0 if t.outcome is not None and t.outcome.passed else 0.0 for t in trajs]
    return {
        "eval_success": statistics.fmean(passed) if passed else 0.0,
        "eval_episodes": len(passed),
        "eval_turns": statistics.fmean(t.num_turns for t in trajs) if trajs else 0.0,
        "eval_policy_version": min((v for t in trajs for v in t.policy_versions), default=0),
        **first_call_stats(trajs, passed, prefix="eval_"),
    }
