from __future__ import annotations

import json
from pathlib import Path

import httpx

from rollyard.engines.chat import ChatClient
from rollyard.tasks import JudgeConfig, JudgePanel, generate, load_task
from rollyard.tasks.judges import parse_vote


def _panel(replies: list[object], seen: list[dict[str, object]], k: int = 3) -> JudgePanel:
    """A panel whose endpoint answers the i-th request with replies[i] (str content or HTTP status)."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"auth": request.headers["authorization"], "path": request.url.path, **body})
        reply = replies[int(body["seed"])]
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "down"}})
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": reply}}]})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    cfg = JudgeConfig(base_url="http://judge/v1", api_key="sk-j", models=["m1", "m2"], k=k)
    return JudgePanel(cfg, client=ChatClient(cfg.base_url, api_key=cfg.api_key, client=http))


def test_votes_are_read_from_json_or_a_leading_yes_or_no() -> None:
    assert parse_vote('sure: {"consistent": true, "reason": "ok"}') == (True, "ok")
    assert parse_vote('{"consistent": false}')[0] is False
    assert parse_vote("No, the tests check another file.")[0] is False
    assert parse_vote("Yes.")[0] is True
    assert parse_vote("maybe")[0] is None
    assert parse_vote('{"consistent": "yes"}')[0] is None


async def test_a_majority_of_yes_votes_keeps_the_task(tmp_path: Path) -> None:
    task = load_task(generate("lookup", tmp_path, 1, seed=2)[0])
    seen: list[dict[str, object]] = []
    verdict = await _panel(['{"consistent": true}', "no", "yes"], seen).review(task)
    assert verdict.keep and verdict.yes == 2
    assert [s["model"] for s in sorted(seen, key=lambda s: s["seed"])] == ["m1", "m2", "m1"]  # type: ignore[arg-type, return-value]
    assert all(s["auth"] == "Bearer sk-j" and s["path"] == "/v1/chat/completions" for s in seen)
    prompt = seen[0]["messages"][1]["content"]  # type: ignore[index]
    assert task.spec.instruction in prompt and "check.py" in prompt


async def test_failed_or_unreadable_judges_abstain_and_cannot_keep_a_task(tmp_path: Path) -> None:
    task = load_task(generate("lookup", tmp_path, 1, seed=2)[0])
    verdict = await _panel(["yes", 500, "hmm"], []).review(task)
    assert not verdict.keep
    assert [v.consistent for v in verdict.votes] == [True, None, None]
    assert "error" in verdict.votes[1].reason
