"""One client for side calls to any OpenAI-compatible chat endpoint (judges, reviewers).

Both the task-review panel (``rollyard.tasks.judges``) and the LLM-judge reward go through
``ChatClient.complete``, so there is one place that builds the request and maps transport
faults: unreachable, 5xx and 429 are ``EngineUnavailable``; other 4xx and replies that are not a
chat completion are ``EngineError``. The base URL may or may not end in ``/v1``.
"""

from __future__ import annotations

from typing import Any

import httpx

from rollyard.core.errors import EngineError, EngineUnavailable

ChatMessages = list[dict[str, str]]


def chat_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class ChatClient:
    """``complete(messages, model=...)`` -> the reply's text; one pooled HTTP client."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = chat_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._own = client is None

    async def complete(
        self,
        messages: ChatMessages,
        *,
        model: str,
        temperature: float = 0.0,
        max_tokens: int = 512,
        seed: int | None = None,
        forced_tool: dict[str, Any] | None = None,
    ) -> str:
        """The reply's text; with ``forced_tool`` (an OpenAI function tool), the arguments of the
        call the endpoint must make to it (``tool_choice: required``)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        if forced_tool is not None:
            body.update(tools=[forced_tool], tool_choice="required")
        try:
            r = await self._client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"chat endpoint {self.url} unreachable: {e}") from e
        if r.status_code >= 500 or r.status_code == 429:
            raise EngineUnavailable(f"chat endpoint answered {r.status_code}")
        if r.status_code >= 400:
            raise EngineError(f"chat endpoint answered {r.status_code}: {r.text[:200]}")
        try:
            message = r.json()["choices"][0]["message"]
            content = message["content"]
            if forced_tool is not None and message.get("tool_calls"):
                content = message["tool_calls"][0]["function"]["arguments"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise EngineError(f"reply is not a chat completion: {e}") from e
        return content if isinstance(content, str) else ""

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()
