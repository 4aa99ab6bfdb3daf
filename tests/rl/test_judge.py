"""The LLM judge: the shared chat client's HTTP plumbing against an httpx MockTransport, the
score parsing, and the judge term reading scores gathered before scoring (unit level only)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rollyard.core import DataError, EngineError, EngineUnavailable, Outcome
from rollyard.engines.chat import ChatClient
from rollyard.rl.judge import TranscriptJudge, parse_score
from rollyard.rl.reward_base import RewardContext, transcript
from rollyard.rl.rewards import JudgeSettings, RewardConfig, TermSpec, score_group


def _reply(content: str) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content}}]}


def _client(handler: Any, **kw: Any) -> tuple[ChatClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(record))
    return ChatClient("http://judge:8000", client=http, **kw), seen


def _judge(client: ChatClient, **kw: Any) -> TranscriptJudge:
    async def ask(messages: list[dict[str, str]]) -> str:
        return await client.complete(messages, model="judge-model")

    return TranscriptJudge(ask, **kw)


async def test_judge_posts_a_chat_completion_and_scales_the_score() -> None:
    client, seen = _client(
        lambda r: httpx.Response(200, json=_reply("Reasoning...\nSCORE: 7.5")), api_key="k"
    )
    assert await _judge(client).score("transcript text") == pytest.approx(0.75)
    (req,) = seen
    body = json.loads(req.content)
    assert req.url.path == "/v1/chat/completions" and req.headers["authorization"] == "Bearer k"
    assert body["model"] == "judge-model" and body["messages"][-1] == {
        "role": "user",
        "content": "transcript text",
    }


async def test_the_judge_reads_the_last_score() -> None:
    client, _ = _client(lambda r: httpx.Response(200, json=_reply("SCORE: 2\nrevised. SCORE: 4")))
    assert await _judge(client, scale=(0, 5)).score("t") == pytest.approx(0.8)


def test_scores_are_parsed_or_rejected() -> None:
    assert parse_score("I'd give it 3 out of", 0, 4) == pytest.approx(0.75)
    with pytest.raises(DataError):
        parse_score("no number here", 0, 10)
    with pytest.raises(DataError):
        parse_score("SCORE: 11", 0, 10)


async def test_transport_and_status_errors_are_typed() -> None:
    for status, error in ((503, EngineUnavailable), (429, EngineUnavailable), (400, EngineError)):
        client, _ = _client(lambda r, s=status: httpx.Response(s, text="no"))
        with pytest.raises(error):
            await client.complete([], model="m")
    client, _ = _client(lambda r: httpx.Response(200, json={"unexpected": True}))
    with pytest.raises(EngineError):
        await client.complete([], model="m")

    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client, _ = _client(boom)
    with pytest.raises(EngineUnavailable):
        await client.complete([], model="m")


async def test_judge_term_scores_the_transcript_through_the_context(make_traj: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["messages"][-1]["content"]
        return httpx.Response(200, json=_reply("SCORE: 10" if "fixed" in text else "SCORE: 0"))

    judge = _judge(_client(handler)[0])
    trajs = [
        make_traj([[1], [2]], texts={0: "looking", 1: "fixed it"}, outcome=Outcome()),
        make_traj([[1]], texts={0: "gave up"}, outcome=Outcome(), tool_calls={0: [("bash", {"c": "ls"})]}),
    ]
    assert "tool call: bash" in transcript(trajs[1]) and "tool result: bash ok" in transcript(trajs[1])
    judged = {t.id: await judge.score(transcript(t)) for t in trajs}
    cfg = RewardConfig(outcome=TermSpec(name="judge"), judge=JudgeSettings())
    scores = score_group(trajs, cfg, RewardContext(judged=judged))
    assert [s.total for s in scores] == [1.0, 0.0]


def test_the_judge_term_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match=r"rewards\.judge"):
        RewardConfig(outcome=TermSpec(name="judge"))
