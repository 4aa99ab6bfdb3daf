"""The gateway bench's required-work floor does a turn's required work: validated body, prompt
rendered against the program's previous turn, engine call, the turn journalled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from tests.gateway.conftest import serving

from rollyard.bench import _required_floor
from rollyard.engines import canned
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import Renderer
from rollyard.gateway.routes_openai_chat import ChatCompletionBody, to_request
from rollyard.gateway.tokenizer import FastTokenizer


def test_each_turn_is_rendered_answered_and_journalled(tiny_model_dir: Path, tmp_path: Path) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
    with serving(canned.make_app(max_model_len=512, token_interval_s=0.0)) as engine:
        app = _required_floor.make_app(engine, tiny_model_dir, tmp_path)
        with serving(app) as url:
            post, key = f"{url}/v1/chat/completions", {"Authorization": "Bearer k1"}
            first = httpx.post(post, json=chat, headers=key, timeout=30)
            again = httpx.post(post, json=chat, headers=key, timeout=30)
            other = httpx.post(post, json=chat, headers={"Authorization": "Bearer k2"}, timeout=30)
            bad = httpx.post(post, json={"messages": "no"}, headers=key, timeout=30)
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json()["object"] == "chat.completion"
    assert first.json()["usage"]["completion_tokens"] == 32
    assert bad.status_code == 500  # a bench instrument: an invalid body fails, it is not answered
    journal = SqliteJournal(tmp_path / "journal.db")
    ids = journal.program_ids()
    assert len(ids) == 2  # one program per key
    traj = journal.trajectory(ids[0])
    prompt = Renderer(FastTokenizer(tiny_model_dir)).render_fresh(to_request(ChatCompletionBody(**chat)))
    turns = [t for s in traj.segments for t in s.turns]
    assert [t.index for t in turns] == [0, 1] and len(traj.segments) == 2  # the repeat is a rewrite
    assert turns[0].prompt_ids == prompt and len(turns[0].completion_ids) == 32
    assert [e.kind.value for e in traj.events].count("context_rewrite") == 1
    journal.close()


async def test_a_programs_concurrent_turns_are_taken_one_at_a_time(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """As in the gateway: turns of one program do not share a previous turn (no index clash)."""
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
    with serving(canned.make_app(max_model_len=512, token_interval_s=0.0)) as engine:
        app = _required_floor.make_app(engine, tiny_model_dir, tmp_path)
        with serving(app) as url:
            async with httpx.AsyncClient(headers={"Authorization": "Bearer k"}, timeout=30) as c:
                answers = await asyncio.gather(
                    *(c.post(f"{url}/v1/chat/completions", json=chat) for _ in range(6))
                )
    assert [a.status_code for a in answers] == [200] * 6
    journal = SqliteJournal(tmp_path / "journal.db")
    (pid,) = journal.program_ids()
    assert journal.turn_count(pid) == 6
    journal.close()
