"""The gateway bench's prompt-length levels measure what they say: conversations that a real
gateway extends turn after turn (one segment, no rewrites), whose every turn reached the engine
with exactly the prompt ids the journal recorded (the history's JSON text is reused, not redone)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from tests.gateway.conftest import serving

from rollyard.bench._gateway_history import Conversation, Filler, _rewrites
from rollyard.bench._gateway_load import Workload, _programs
from rollyard.bench._procs import ADMIN, _gateway
from rollyard.engines.canned import answer, make_app


async def test_grown_conversations_are_extended_and_reach_the_engine_as_recorded(
    tiny_model_dir: Path,
) -> None:
    with serving(make_app(max_model_len=40_960)) as engine, _gateway(engine, tiny_model_dir) as (url, _):
        work = Workload(engine, tiny_model_dir)
        filler = Filler(work.renderer.tok)
        await work.backend.aclose()
        async with aiohttp.ClientSession() as session:
            before = await _rewrites(session, url)
            ids, keys = await _programs(session, url, 2)
            convs = [Conversation(k) for k in keys]
            sizes = []
            for turn in range(4):
                for i, c in enumerate(convs):
                    await c.turn(
                        session, url, filler.text(10 * turn + i, 600) if turn < 3 else "run the tests"
                    )
                sizes.append(convs[0].prompt_tokens)
            assert await _rewrites(session, url) == before
            async with session.get(f"{url}/programs/{ids[0]}/trajectory", headers={"x-api-key": ADMIN}) as r:
                segments = (await r.json())["segments"]
    assert sizes == sorted(sizes) and sizes[-1] > 3 * 600 * 0.8  # grown by the filler's ~600 tokens a turn
    assert [len(s["turns"]) for s in segments] == [4]
    for turn in segments[0]["turns"]:  # the canned engine's answer is a function of the prompt it got
        body = {
            "prompt": turn["prompt_ids"],
            "max_tokens": len(turn["completion_ids"]),
            "return_token_ids": True,
        }
        assert answer(body)["choices"][0]["token_ids"] == turn["completion_ids"]
