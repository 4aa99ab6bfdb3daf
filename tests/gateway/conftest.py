"""Gateway test fixtures: a scripted in-process engine (unit tests only) and an app around it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from rollyard.core.errors import EngineUnavailable
from rollyard.core.net import free_port
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion, CompletionDelta, EngineStats
from rollyard.gateway import FastTokenizer, build_gateway, create_app

ADMIN = "test-admin-token"


class ScriptedBackend:
    """Answers each call with the next scripted text (tokenized one character at a time, so the
    completion ids differ from what re-tokenizing the text would give), plus eos."""

    def __init__(self, tok: FastTokenizer, name: str = "fake", max_model_len: int = 512) -> None:
        self.tok, self.name, self.max_model_len = tok, name, max_model_len
        self.script: list[str] = []
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.returned: list[list[int]] = []
        self.down = False
        self.kv_usage = 0.0
        self.truncate_to: int | None = None
        self.errors: list[Exception] = []  # raised by the next generate calls, in order

    @property
    def policy_version(self) -> int:
        return 3

    def _ids(self, params: SamplingParams) -> tuple[list[int], FinishReason]:
        text = self.script.pop(0) if self.script else "ok"
        ids = [t for ch in text for t in self.tok.encode(ch)] + [self.tok.eos_id]
        if len(ids) > params.max_tokens:
            return ids[: params.max_tokens], FinishReason.LENGTH
        return ids, FinishReason.STOP

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if self.down:
            raise EngineUnavailable(f"{self.name} is down")
        if self.errors:
            raise self.errors.pop(0)
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        ids, finish = self._ids(params)
        self.returned.append(ids)
        lps = [-0.25 - 0.01 * i for i in range(len(ids))]
        return Completion(
            token_ids=ids, logprobs=lps, finish_reason=finish, prompt_tokens=len(prompt_ids), policy_version=3
        )

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        c = await self.generate(prompt_ids, params)
        for i, (t, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            last = i == len(c.token_ids) - 1
            yield CompletionDelta(
                token_ids=[t],
                logprobs=[lp],
                finish_reason=c.finish_reason if last else None,
                policy_version=3,
            )

    async def stats(self) -> EngineStats:
        if self.down:
            raise EngineUnavailable(f"{self.name} is down")
        return EngineStats(kv_usage=self.kv_usage)

    async def health(self) -> bool:
        return not self.down

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def abort(self, request_ids: list[str] | None = None) -> None: ...
    async def reset_prefix_cache(self) -> None: ...
    async def load_weights(self, path: str, version: int) -> None: ...
    async def aclose(self) -> None: ...


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> FastTokenizer:
    return FastTokenizer(tiny_model_dir)


@pytest.fixture
def engine(tok: FastTokenizer) -> ScriptedBackend:
    return ScriptedBackend(tok)


@pytest.fixture
def client(engine: ScriptedBackend, tok: FastTokenizer, tmp_path: Path) -> Iterator[TestClient]:
    gw = build_gateway({"fake": engine}, tok, tmp_path / "journal.db", ADMIN, "tiny")
    with TestClient(create_app(gw, poll_interval_s=0.05)) as c:
        yield c


def new_program(client: TestClient, **fields: object) -> dict[str, object]:
    r = client.post("/programs", json=fields, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return r.json()


def trajectory(client: TestClient, program_id: str) -> dict[str, object]:
    r = client.get(f"/programs/{program_id}/trajectory", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return r.json()


@contextlib.contextmanager
def running(config: uvicorn.Config) -> Iterator[None]:
    """A uvicorn server on ``config`` in a thread, started before the body, stopped after it."""
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    try:
        yield
    finally:
        srv.should_exit = True
        t.join(10)


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app on a real port (uvicorn in a thread): real connections, keep-alive, concurrency."""
    port = free_port()
    with running(uvicorn.Config(app, port=port, log_level="critical")):
        yield f"http://127.0.0.1:{port}"
