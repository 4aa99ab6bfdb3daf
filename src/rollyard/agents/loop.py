"""The white-box agent: a tool-calling loop over an OpenAI-compatible endpoint (its program's
base URL and key on the gateway), with tools executed in the program's sandbox."""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Any

import openai
from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field

from rollyard.agents.context import ContextPolicy, Message, apply_policy, estimate_tokens, with_note
from rollyard.agents.tools import TOOLS, ToolChoice, ToolOutcome, run_tool, tool_choice_param
from rollyard.core.clock import Clock, SystemClock
from rollyard.core.events import ContextRewriteEvent, Event, EventKind, ToolResultEvent
from rollyard.sandbox.base import Sandbox

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You solve tasks in a Linux workspace using tools: bash, read_file, write_file. "
    "Call submit when the task is done."
)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "policy"
    system_prompt: str = SYSTEM_PROMPT
    max_turns: int = Field(default=20, ge=1)
    tool_timeout_s: float = Field(default=30.0, gt=0)
    max_tool_output_chars: int = Field(default=2000, ge=64)
    context_limit: int | None = Field(default=None, ge=1)  # tokens; policies with a fraction need it
    policies: list[ContextPolicy] = Field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    # required: every turn calls a tool; a tool's name: every turn calls that one
    tool_choice: ToolChoice = "auto"
    # with tool_choice other than auto: only the first N model turns are forced, later ones are the
    # model's own choice (free text, sampled from the unconstrained policy); None: every turn
    required_turns: int | None = Field(default=None, ge=1)
    # bash commands run before the first model turn, in the conversation as the agent's own calls
    # and their results: the environment's scripted orientation step (e.g. listing the workspace)
    opening: list[str] = Field(default_factory=list)


class ExitReason(StrEnum):
    SUBMITTED = "submitted"
    FINAL_ANSWER = "final_answer"  # the model answered without calling a tool
    MAX_TURNS = "max_turns"
    CONTEXT_EXCEEDED = "context_exceeded"
    ERROR = "error"


class AgentResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_reason: ExitReason
    submitted: bool = False
    final_answer: str | None = None
    turns: int = 0
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    events: list[Event] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None


class WhiteBoxAgent:
    """One agent run per ``run`` call; state lives in the call, so one agent may run many."""

    def __init__(self, client: AsyncOpenAI, config: AgentConfig, *, clock: Clock | None = None) -> None:
        self.client = client
        self.config = config
        self.clock = clock or SystemClock()

    def _rewrite(self, messages: list[Message], tokens: int, turn: int, events: list[Event]) -> list[Message]:
        """Apply the context policies; each one that fires is an event and a note to the model."""
        for policy in self.config.policies:
            new = apply_policy(policy, messages, tokens, self.config.context_limit)
            if new is not messages:
                count = 1 + sum(e.kind == EventKind.CONTEXT_REWRITE for e in events)
                new = with_note(new, policy.kind, len(messages) - len(new), count)
                rewrite = ContextRewriteEvent(
                    reason=f"policy:{policy.kind.value}",
                    policy=policy.kind.value,
                    messages_before=len(messages),
                    messages_after=len(new),
                    tokens_before=tokens,
                )
                events.append(Event.of(rewrite, turn_index=turn, at=self.clock.now()))
                messages = new
                tokens = estimate_tokens(messages)
        return messages

    async def run(
        self, instruction: str, sandbox: Sandbox, *, events: list[Event] | None = None
    ) -> AgentResult:
        """Run to an exit; events go to ``events`` when given (a caller that may cut the run off
        keeps what happened so far), and are the result's ``events`` either way."""
        cfg = self.config
        messages: list[Message] = [
            {"role": "system", "content": cfg.system_prompt},
            {"role": "user", "content": instruction},
        ]
        r = AgentResult(exit_reason=ExitReason.MAX_TURNS)
        if events is not None:
            r.events = events
        tokens, counted = 0, 0  # usage of the last response, and how many messages it covered
        extra: dict[str, Any] = {}
        if cfg.temperature is not None:
            extra["temperature"] = cfg.temperature
        if cfg.max_tokens is not None:
            extra["max_tokens"] = cfg.max_tokens
        await self._open(sandbox, messages, r)
        for turn in range(cfg.max_turns):
            if turn:
                est = tokens + estimate_tokens(messages[counted:])
                messages = self._rewrite(messages, est, turn, r.events)
            forced = cfg.tool_choice != "auto" and (cfg.required_turns is None or turn < cfg.required_turns)
            try:
                resp = await self.client.chat.completions.create(
                    model=cfg.model,
                    messages=messages,
                    tools=TOOLS,
                    **extra,  # type: ignore[arg-type]
                    **({"tool_choice": tool_choice_param(cfg.tool_choice)} if forced else {}),
                )
            except openai.BadRequestError as e:
                reason = ExitReason.CONTEXT_EXCEEDED if "context" in str(e).lower() else ExitReason.ERROR
                return self._end(r, reason, messages, error=str(e))
            except openai.OpenAIError as e:
                return self._end(r, ExitReason.ERROR, messages, error=str(e))
            r.turns = turn + 1
            if not resp.choices:
                return self._end(r, ExitReason.ERROR, messages, error="response without choices")
            msg = resp.choices[0].message
            assistant: Message = {"role": "assistant", "content": msg.content}
            reasoning = getattr(msg, "reasoning_content", None)
            if reasoning:
                assistant["reasoning_content"] = reasoning
            calls = msg.tool_calls or []
            if calls:
                assistant["tool_calls"] = [c.model_dump(mode="json", exclude_none=True) for c in calls]
            messages.append(assistant)
            if resp.usage is not None:
                tokens, counted = resp.usage.total_tokens, len(messages)
            if not calls:
                r.final_answer = msg.content
                return self._end(r, ExitReason.FINAL_ANSWER, messages)
            done = False
            for call in calls:
                name = getattr(getattr(call, "function", None), "name", "") or ""
                raw = getattr(getattr(call, "function", None), "arguments", None)
                out = await self._call(sandbox, name, raw, call.id, turn, messages, r)
                r.tool_calls += 1
                r.malformed_tool_calls += out.error
                if out.submitted:
                    r.submitted, r.final_answer, done = True, out.answer, True
            if done:
                return self._end(r, ExitReason.SUBMITTED, messages)
        return self._end(r, ExitReason.MAX_TURNS, messages)

    async def _call(
        self,
        sandbox: Sandbox,
        name: str,
        raw: str | None,
        call_id: str,
        turn: int | None,
        messages: list[Message],
        r: AgentResult,
    ) -> ToolOutcome:
        """Run one tool call; its result goes to the conversation and the events (``turn`` None:
        no model turn made it, so no turn's penalty or chunk boundary is charged for it)."""
        cfg = self.config
        t0 = self.clock.now()
        out = await run_tool(
            sandbox, name, raw, timeout=cfg.tool_timeout_s, max_chars=cfg.max_tool_output_chars
        )
        result = ToolResultEvent(
            name=name,
            call_id=call_id,
            is_error=out.error or out.failed,
            malformed=out.error,
            exit_code=out.exit_code,
            timed_out=out.timed_out,
            duration_s=max(0.0, self.clock.now() - t0),
        )
        r.events.append(Event.of(result, turn_index=turn, at=t0))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": out.content})
        return out

    async def _open(self, sandbox: Sandbox, messages: list[Message], r: AgentResult) -> None:
        """The scripted opening: each command as an assistant bash call (prompt tokens, never
        trained: the engine did not sample them) followed by its real result. Its results follow
        no model turn (``turn_index`` None): a failing opening command is the config's doing, not
        something to penalise or credit in the first turn."""
        for i, command in enumerate(self.config.opening):
            call_id = f"opening-{i}"
            raw = json.dumps({"command": command})
            call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": raw}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            await self._call(sandbox, "bash", raw, call_id, None, messages, r)

    @staticmethod
    def _end(
        r: AgentResult, reason: ExitReason, messages: list[Message], error: str | None = None
    ) -> AgentResult:
        r.exit_reason = reason
        r.messages = json.loads(json.dumps(messages, default=str))
        r.error = error
        log.info("agent exit=%s turns=%d malformed=%d", reason.value, r.turns, r.malformed_tool_calls)
        return r
