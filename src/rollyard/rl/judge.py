"""LLM-as-judge reward: ask a chat model for a score on a known scale, read it, map it to [0, 1].

The judge reads the last ``SCORE: x`` in the reply (falling back to the last number). A reply
without a usable score is a ``DataError``, so a broken judge never silently becomes a reward of
zero. The transport is injected (``ask``: messages -> reply text); the run wires the one shared
``rollyard.engines.chat.ChatClient``, so this module stays free of I/O.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable

from rollyard.core.errors import DataError

log = logging.getLogger(__name__)

DEFAULT_SYSTEM = (
    "You grade the work of a software agent. Read the transcript, judge whether the task was "
    "solved well, and end your reply with a line 'SCORE: <number from {lo} to {hi}>'."
)

_SCORE = re.compile(r"SCORE\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

Ask = Callable[[list[dict[str, str]]], Awaitable[str]]


def parse_score(text: str, lo: float, hi: float) -> float:
    """The judge's score mapped to [0, 1]; raises DataError when absent or off the scale."""
    found = _SCORE.findall(text) or _NUMBER.findall(text)
    if not found:
        raise DataError(f"judge reply has no score: {text[:200]!r}")
    value = float(found[-1])
    if not math.isfinite(value) or value < lo or value > hi:
        raise DataError(f"judge score {value} is outside [{lo}, {hi}]")
    return (value - lo) / (hi - lo)


class TranscriptJudge:
    """Scores a transcript in [0, 1] through ``ask``."""

    def __init__(
        self, ask: Ask, *, scale: tuple[float, float] = (0.0, 10.0), system_prompt: str = DEFAULT_SYSTEM
    ) -> None:
        lo, hi = scale
        if not hi > lo:
            raise DataError(f"judge scale {scale} must go up")
        self.ask = ask
        self.scale = (float(lo), float(hi))
        self.system_prompt = system_prompt.format(lo=lo, hi=hi)

    def messages(self, transcript: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": transcript},
        ]

    async def score(self, transcript: str) -> float:
        score = parse_score(await self.ask(self.messages(transcript)), *self.scale)
        log.debug("judge score=%.3f", score)
        return score
