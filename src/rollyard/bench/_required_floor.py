"""The work a non-streamed chat turn cannot skip, with none of the gateway's other work: the
second floor of ``rollyard bench gateway``.

Per ``POST /v1/chat/completions`` it does what the product exists to do, each step by the
gateway's own code: parse and validate the body (``ChatCompletionBody``), render it to token
ids against the program's previous turn (``Renderer.render``), bound the sampling
(``sampling_for``), call the engine and read its ids and logprobs (``VLLMBackend.generate``),
decode and parse the completion and build the turn's record (``build_turn``), commit it to
the journal (``SqliteJournal.record_turn``: group commit, WAL, background checkpoints) and
answer in OpenAI's shape (``to_body``), one turn of a program at a time. What it leaves out is
everything else the gateway does: authentication, the error budget, idle tracking, scheduling
and engine choice, retries, divided rollout, metrics, the route table, Starlette's request and
response objects.

The bare relay (``_floor_proxy``) measures what one Python HTTP hop costs; this measures that
hop plus the required work, on the same server and client stack (raw ASGI under uvicorn,
aiohttp to the engine). The gateway's CPU per request over this one's is what its glue costs.
Programs are known by their bearer key, created (and saved) on first sight with the bench's
sampling policy.

    python -m rollyard.bench._required_floor --engine URL --port PORT --model-dir DIR --state-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pydantic_core
import uvicorn

from rollyard.bench._gateway_load import SAMPLING
from rollyard.core.clock import SystemClock
from rollyard.core.program import Program, SamplingPolicy
from rollyard.engines.canned import read_body
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway.divided import Generated
from rollyard.gateway.heap import tune_heap
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import ConversationState, Renderer
from rollyard.gateway.routes_openai_chat import ChatCompletionBody, to_body, to_request
from rollyard.gateway.sampling import context_limit, sampling_for
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.gateway.turn_record import build_turn
from rollyard.sched import Start

MODEL = "tiny"  # the name the bench serves


def make_app(engine_url: str, model_dir: Path, state_dir: Path) -> Any:
    """A raw ASGI app: each request, the required work of one turn (see the module docstring)."""
    renderer = Renderer(FastTokenizer(model_dir))
    journal = SqliteJournal(state_dir / "journal.db")
    backend = VLLMBackend(engine_url)
    programs: dict[bytes, Program] = {}
    states: dict[str, ConversationState] = {}
    locks: dict[str, asyncio.Lock] = {}
    json_headers = [(b"content-type", b"application/json")]
    clock = SystemClock()

    async def turn(key: bytes, raw: bytes) -> bytes:
        program = programs.get(key)
        if program is None:
            program = programs[key] = Program(sampling=SamplingPolicy(**SAMPLING))
            journal.save_program(program)
        request = to_request(
            ChatCompletionBody.model_validate(pydantic_core.from_json(raw, allow_inf_nan=False))
        )
        async with locks.setdefault(program.id, asyncio.Lock()):  # a program's turns in order
            prev = states.get(program.id)
            plan = renderer.render(request, prev, in_place=True)
            limit = context_limit(program, backend.max_model_len)
            params = sampling_for(request, program, len(plan.prompt_ids), limit)
            started = clock.now()
            completion = await backend.generate(plan.prompt_ids, params)
            engine_s = clock.now() - started
            gen = Generated(completion, Start("", program.id, backend.name), started, engine_s)
            rec = build_turn(renderer, request, plan, params, gen, prev, started, clock.now(), MODEL)
            states[program.id] = rec.state
            await journal.record_turn(program, rec.turn, rec.segment, rec.events, rec.state)
        return pydantic_core.to_json(to_body(rec.result))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await backend.model_name()  # learns max_model_len, as the gateway does at start
                await send({"type": "lifespan.startup.complete"})
            await backend.aclose()
            journal.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        key = dict(scope["headers"]).get(b"authorization", b"")
        body = await turn(key, await read_body(receive))
        await send({"type": "http.response.start", "status": 200, "headers": json_headers})
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    a = p.parse_args()
    app = make_app(a.engine, a.model_dir, a.state_dir)
    tune_heap(freeze=True)  # as ``rollyard gateway`` does once its app is built
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
