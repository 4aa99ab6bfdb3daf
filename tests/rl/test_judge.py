"""The LLM judge's HTTP plumbing against an httpx MockTransport (unit level only)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rollyard.core import DataError, EngineError, EngineUnavailable, Outcome
from rollyard.rl.judge import LLMJudge, parse_score
from rollyard.rl.rewards import RewardConfig, RewardContext, TermSpec, score_group


def _reply(content: str) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content}}]}


def _judge(handler: Any, **kw: Any) -> tuple[LLMJudge, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    client = httpx.Client(transport=httpx.MockTransport(record))
    aclient = httpx.AsyncClient(transport=httpx.MockTransport(record))
    return LLMJudge("http://judge:8000", "judge-model", client=client, async_client=aclient, **kw), seen


def test_judge_posts_a_chat_completion_and_scales_the_score() -> None:
    judge, seen = _judge(lambda r: httpx.Response(200, json=_reply("Reasoning...\nSCORE: 7.5")), api_key="k")
    assert judge.score("transcript text") == pytest.approx(0.75)
    (req,) = seen
    body = json.loads(req.content)
    assert req.url.path == "/v1/chat/completions" and req.headers["authorization"] == "Bearer k"
    assert body["model"] == "judge-model" and body["messages"][-1] == {
        "role": "user",
        "content": "transcript text",
    }


async def test_async_judge_reads_the_last_score() -> None:
    judge, _ = _judge(lambda r: httpx.Response(200, json=_reply("SCORE: 2\nrevised. SCORE: 4")), scale=(0, 5))
    assert await judge.ascore("t") == pytest.approx(0.8)


def test_scores_are_parsed_or_rejected() -> None:
    assert parse_score("I'd give it 3 out of", 0, 4) == pytest.approx(0.75)
    with pytest.raises(DataError):
        parse_score("no number here", 0, 10)
    with pytest.raises(DataError):
        parse_score("SCORE: 11", 0, 10)


def test_transport_and_status_errors_are_typed() -> None:
    judge, _ = _judge(lambda r: httpx.Response(503, text="busy"))
    with pytest.raises(EngineUnavailable):
        judge.score("t")
    judge, _ = _judge(lambda r: httpx.Response(400, text="bad"))
    with pytest.raises(EngineError):
        judge.score("t")
    judge, _ = _judge(lambda r: httpx.Response(200, json={"unexpected": True}))
    with pytest.raises(EngineError):
        judge.score("t")

    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    judge, _ = _judge(boom)
    with pytest.raises(EngineUnavailable):
        judge.score("t")


def test_judge_term_scores_the_decoded_transcript(make_traj: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["messages"][-1]["content"]
        return httpx.Response(200, json=_reply("SCORE: 10" if "fixed" in text else "SCORE: 0"))

    judge, _ = _judge(handler)
    trajs = [
        make_traj([[1], [2]], texts={0: "looking", 1: "fixed it"}, outcome=Outcome()),
        make_traj([[1]], texts={0: "gave up"}, outcome=Outcome()),
    ]
    scores = score_group(trajs, RewardConfig(outcome=TermSpec(name="judge")), RewardContext(judge=judge))
    assert [s.total for s in scores] == [1.0, 0.0]
