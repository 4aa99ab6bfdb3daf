"""Divided rollout against a deterministic fake engine: chunk continuation, merging, moves.

The fake's next token is a function of the whole prefix (so a continuation from any point gives
what one long call would), and it ends with eos where the prefix sum says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason, Trajectory
from rollyard.engines.base import Completion, CompletionDelta, EngineStats
from rollyard.gateway import FastTokenizer, build_gateway, create_app

from .conftest import ADMIN, new_program, trajectory


class PrefixEngine:
    """Token t+1 = f(prefix); logprob depends on position. ``eos_at``: total length that ends it."""

    def __init__(self, tok: FastTokenizer, name: str, eos_at: int | None = None) -> None:
        self.tok, self.name, self.max_model_len = tok, name, 4096
        self.eos_at = eos_at
        self.calls: list[tuple[int, int]] = []  # (prompt length, max_tokens)

    @property
    def policy_version(self) -> int:
        return 1

    def _run(self, prompt: list[int], params: SamplingParams) -> Completion:
        self.calls.append((len(prompt), params.max_tokens))
        seq = list(prompt)
        ids: list[int] = []
        finish = FinishReason.LENGTH
        while len(ids) < params.max_tokens:
            if self.eos_at is not None and len(seq) >= self.eos_at:
                ids.append(self.tok.eos_id)
                finish = FinishReason.STOP
                break
            t = 10 + (sum(seq[-3:]) * 7 + len(seq)) % 50
            ids.append(t)
            seq.append(t)
        lps = [-0.01 * ((len(prompt) + i) % 13) for i in range(len(ids))]
        return Completion(token_ids=ids, logprobs=lps, finish_reason=finish, prompt_tokens=len(prompt))

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return self._run(prompt_ids, params)

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        c = self._run(prompt_ids, params)
        for i, (t, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            end = c.finish_reason if i == len(c.token_ids) - 1 else None
            yield CompletionDelta(token_ids=[t], logprobs=[lp], finish_reason=end)

    async def stats(self) -> EngineStats:
        return EngineStats()

    async def health(self) -> bool:
        return True

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def abort(self, request_ids: list[str] | None = None) -> None: ...
    async def reset_prefix_cache(self) -> None: ...
    async def load_weights(self, path: str, version: int) -> None: ...
    async def aclose(self) -> None: ...


def app(tok: FastTokenizer, tmp_path: Path, divide: int | None, *engines: PrefixEngine) -> TestClient:
    gw = build_gateway(
        {e.name: e for e in engines}, tok, tmp_path / f"j{divide}.db", ADMIN, "tiny", divide_tokens=divide
    )
    return TestClient(create_app(gw, poll_interval_s=0.05))


def ask(c: TestClient, max_tokens: int, stream: bool = False) -> tuple[dict, dict]:
    p = new_program(c, sampling={"temperature": 0.0, "max_tokens": max_tokens})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count"}], "stream": stream}
    r = c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {p['api_key']}"})
    assert r.status_code == 200, r.text
    return p, ({"text": r.text} if stream else r.json())


def traj(c: TestClient, pid: str) -> Trajectory:
    return Trajectory.model_validate(trajectory(c, pid))


@pytest.fixture
def pair(tok: FastTokenizer, tmp_path: Path) -> Iterator[tuple[TestClient, TestClient, PrefixEngine]]:
    e = PrefixEngine(tok, "e")
    with app(tok, tmp_path, None, PrefixEngine(tok, "u")) as whole, app(tok, tmp_path, 16, e) as div:
        yield whole, div, e


def test_a_divided_generation_is_the_undivided_one_in_one_turn(pair) -> None:
    whole, div, engine = pair
    pw, rw = ask(whole, 70)
    pd, rd = ask(div, 70)
    assert engine.calls == [(engine.calls[0][0] + 16 * i, min(16, 70 - 16 * i)) for i in range(5)]
    assert rd["choices"][0]["message"] == rw["choices"][0]["message"]
    assert rd["usage"] == rw["usage"] and rd["choices"][0]["finish_reason"] == "length"
    tw, td = traj(whole, pw["id"]), traj(div, pd["id"])
    assert td.num_turns == 1
    a, b = tw.turns[0], td.turns[0]
    assert a.completion_ids == b.completion_ids and len(b.completion_ids) == 70
    assert a.completion_logprobs == b.completion_logprobs
    note = next(e.data["divided"] for e in td.events if "divided" in e.data)
    assert note["chunks"] == 5 and note["chunk_tokens"] == [16, 16, 16, 16, 6]


def test_streaming_runs_seamlessly_across_chunks(pair) -> None:
    whole, div, _ = pair
    _, sw = ask(whole, 50, stream=True)
    _, sd = ask(div, 50, stream=True)
    assert sd["text"].count('"finish_reason":"length"') == 1
    strip = lambda s: [ln for ln in s.splitlines() if '"content"' in ln]  # noqa: E731
    assert [ln.split('"content"')[1][:40] for ln in strip(sd["text"])] == [
        ln.split('"content"')[1][:40] for ln in strip(sw["text"])
    ]


def test_eos_inside_a_chunk_ends_the_generation(tok: FastTokenizer, tmp_path: Path) -> None:
    e = PrefixEngine(tok, "e")
    with app(tok, tmp_path, 8, e) as c:
        ask(c, 8)  # learn the prompt length
        e.eos_at = e.calls[0][0] + 20  # prompt + 20 generated: inside the third chunk
        p, r = ask(c, 64)
        assert r["choices"][0]["finish_reason"] == "stop"
        assert [m for _, m in e.calls[1:]] == [8, 8, 8]
        assert len(traj(c, p["id"]).turns[0].completion_ids) == 21  # 20 ids, then eos


def test_short_requests_and_constrained_ones_run_in_one_piece(pair) -> None:
    _, div, engine = pair
    ask(div, 16)
    p = new_program(div, sampling={"max_tokens": 64})
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools}
    body["tool_choice"] = "required"
    r = div.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {p['api_key']}"})
    assert r.status_code == 200, r.text
    assert [m for _, m in engine.calls] == [16, 64]


async def test_the_next_chunk_competes_for_the_slot_its_predecessor_freed(tok: FastTokenizer) -> None:
    """A chunk boundary must not hand the request's slot to a queued stranger first."""
    import asyncio

    from rollyard.core.clock import FakeClock
    from rollyard.gateway.metrics import GatewayMetrics
    from rollyard.gateway.pool import EnginePool
    from rollyard.sched import Scheduler, make_policy

    pool = EnginePool(
        {"e": PrefixEngine(tok, "e")}, Scheduler(FakeClock(), make_policy("seer")), GatewayMetrics(), 1
    )
    first = await pool.acquire("long", 10, 500, chunk=0)
    stranger = asyncio.ensure_future(pool.acquire("short", 10, 20))
    await asyncio.sleep(0)
    assert not stranger.done()  # the engine's one slot is taken

    async def next_chunk() -> object:  # as the gateway does: release, then submit in the same step
        pool.release(first, final=False)
        return await pool.acquire("long", 74, 436, chunk=1)

    nxt = asyncio.ensure_future(next_chunk())
    for _ in range(3):
        await asyncio.sleep(0)
    assert nxt.done() and not stranger.done()  # longest first: the chunk keeps the slot
    pool.release(nxt.result())
    await asyncio.sleep(0)
    assert stranger.done()
