"""An optional panel of k LLM judges (any OpenAI-compatible endpoint) that votes on whether a
task's instruction and its hidden tests agree. A majority of yes votes keeps the task."""

from __future__ import annotations

import asyncio
import json
import logging
import re

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import RollyardError
from rollyard.engines.chat import ChatClient
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)

_MAX_TEST_CHARS = 6000
_JSON = re.compile(r"\{.*\}", re.DOTALL)
SYSTEM = (
    "You review programming tasks for a training set. Given an instruction and the hidden tests "
    "that grade it, decide whether a competent solver who follows only the instruction would pass "
    'the tests. Reply with JSON only: {"consistent": true or false, "reason": "one sentence"}.'
)


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str  # e.g. http://host:8000/v1
    api_key: str = Field(default="EMPTY", repr=False)
    models: list[str] = Field(min_length=1)  # judge i uses models[i % len(models)]
    k: int = Field(default=3, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    max_tokens: int = Field(default=256, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)


class JudgeVote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    judge: int
    model: str
    consistent: bool | None  # None: the judge failed or answered unreadably (abstains)
    reason: str = ""


class PanelVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    votes: list[JudgeVote]
    keep: bool

    @property
    def yes(self) -> int:
        return sum(v.consistent is True for v in self.votes)


def task_prompt(task: Task) -> str:
    """The user message: instruction plus the hidden tests' text (truncated)."""
    parts = [f"Instruction:\n{task.spec.instruction}\n", "Hidden tests:"]
    budget = _MAX_TEST_CHARS
    for p in sorted(task.tests_dir.rglob("*")):
        if not p.is_file() or budget <= 0:
            continue
        text = p.read_text(errors="replace")[:budget]
        budget -= len(text)
        parts.append(f"--- {p.relative_to(task.tests_dir)}\n{text}")
    parts.append(f"Test command: {task.spec.test_command}")
    return "\n".join(parts)


def parse_vote(content: str) -> tuple[bool | None, str]:
    """Read a judge's reply: a JSON object if there is one, else a leading yes/no."""
    m = _JSON.search(content)
    if m:
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("consistent"), bool):
            return obj["consistent"], str(obj.get("reason", ""))[:500]
    word = content.strip().lower()[:3]
    if word.startswith("yes"):
        return True, content.strip()[:500]
    if word.startswith("no"):
        return False, content.strip()[:500]
    return None, f"unreadable reply: {content[:200]!r}"


class JudgePanel:
    """k judges asked concurrently; abstentions count as 'not yes'."""

    def __init__(self, config: JudgeConfig, client: ChatClient | None = None) -> None:
        self.config = config
        self._client = client or ChatClient(
            config.base_url, api_key=config.api_key, timeout_s=config.timeout_s
        )
        self._own_client = client is None

    async def _ask(self, i: int, prompt: str) -> JudgeVote:
        model = self.config.models[i % len(self.config.models)]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        try:
            content = await self._client.complete(
                messages,
                model=model,
                temperature=self.config.temperature,
                max_tokens=self.config.max_tokens,
                seed=i,
            )
        except RollyardError as e:
            log.warning("judge=%d model=%s failed: %s", i, model, e.message)
            return JudgeVote(judge=i, model=model, consistent=None, reason=f"error: {e.message}"[:300])
        consistent, reason = parse_vote(content)
        return JudgeVote(judge=i, model=model, consistent=consistent, reason=reason)

    async def review(self, task: Task) -> PanelVerdict:
        prompt = task_prompt(task)
        votes = await asyncio.gather(*(self._ask(i, prompt) for i in range(self.config.k)))
        yes = sum(v.consistent is True for v in votes)
        return PanelVerdict(votes=list(votes), keep=yes * 2 > self.config.k)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()
