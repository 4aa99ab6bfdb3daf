"""LLM-as-judge reward over any OpenAI-compatible ``/v1/chat/completions`` endpoint.

The judge asks for a score on a known scale and reads the last ``SCORE: x`` in the reply
(falling back to the last number), then maps it to [0, 1]. Transport faults become
``EngineError`` / ``EngineUnavailable``; a reply without a usable score is a ``DataError``, so
a broken judge never silently becomes a reward of zero.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import httpx

from rollyard.core.errors import DataError, EngineError, EngineUnavailable

log = logging.getLogger(__name__)

DEFAULT_SYSTEM = (
    "You grade the work of a software agent. Read the transcript, judge whether the task was "
    "solved well, and end your reply with a line 'SCORE: <number from {lo} to {hi}>'."
)

_SCORE = re.compile(r"SCORE\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_score(text: str, lo: float, hi: float) -> float:
    """The judge's score mapped to [0, 1]; raises DataError when absent or off the scale."""
    found = _SCORE.findall(text) or _NUMBER.findall(text)
    if not found:
        raise DataError(f"judge reply has no score: {text[:200]!r}")
    value = float(found[-1])
    if not math.isfinite(value) or value < lo or value > hi:
        raise DataError(f"judge score {value} is outside [{lo}, {hi}]")
    return (value - lo) / (hi - lo)


class LLMJudge:
    """Scores a transcript with a chat model; sync and async clients may be injected."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        scale: tuple[float, float] = (0.0, 10.0),
        system_prompt: str = DEFAULT_SYSTEM,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        client: httpx.Client | None = None,
        async_client: httpx.AsyncClient | None = None,
    ) -> None:
        lo, hi = scale
        if not hi > lo:
            raise DataError(f"judge scale {scale} must go up")
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        if base_url.rstrip("/").endswith("/v1"):
            self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.scale = (float(lo), float(hi))
        self.system_prompt = system_prompt.format(lo=lo, hi=hi)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout_s
        self._client = client
        self._async_client = async_client

    def request_body(self, transcript: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": transcript},
            ],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def _read(self, response: httpx.Response) -> float:
        if response.status_code >= 500 or response.status_code == 429:
            raise EngineUnavailable(f"judge endpoint answered {response.status_code}")
        if response.status_code >= 400:
            raise EngineError(f"judge endpoint answered {response.status_code}: {response.text[:200]}")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise EngineError(f"judge reply is not a chat completion: {e}") from e
        if not isinstance(content, str):
            raise DataError("judge reply has no text content")
        score = parse_score(content, *self.scale)
        log.debug("judge model=%s score=%.3f", self.model, score)
        return score

    def score(self, transcript: str) -> float:
        """Score in [0, 1] for one transcript (blocking)."""
        client = self._client or httpx.Client(timeout=self._timeout)
        try:
            response = client.post(self.url, json=self.request_body(transcript), headers=self._headers)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"judge endpoint unreachable: {e}") from e
        finally:
            if self._client is None:
                client.close()
        return self._read(response)

    async def ascore(self, transcript: str) -> float:
        """Score in [0, 1] for one transcript, on the event loop."""
        client = self._async_client or httpx.AsyncClient(timeout=self._timeout)
        try:
            response = await client.post(self.url, json=self.request_body(transcript), headers=self._headers)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"judge endpoint unreachable: {e}") from e
        finally:
            if self._async_client is None:
                await client.aclose()
        return self._read(response)
