"""An engine that answers at once: ``POST /v1/completions`` in vLLM's shape, nothing computed.

Two users: the benches (below) and the scripted warm start (``rollout.sft_scripted``), which gives
it a reply function; it lives in ``engines`` so both may import it.

``ROLLYARD_BENCH_GATEWAY_ENGINE=canned rollyard bench gateway`` puts it where vLLM would be, so
the gateway's and the relay's CPU per request are measured without an engine taking the same
two cores (on this machine a real vLLM made the relay's own CPU per request vary 2.4x between
runs). Each answer has ``max_tokens`` token ids (seeded from the prompt, so the same prompt gets
the same ids), a logprob per token, ``finish_reason: length``; with ``stream`` the same answer
comes as vLLM streams it, one server-sent event per token every ``--token-interval-ms`` (20 ms:
a decode step of a batch on a GPU), then the usage and ``[DONE]``.
``/v1/models``, ``/health`` and an empty ``/metrics`` are enough for the gateway to start and
poll it.

    python -m rollyard.engines.canned --port PORT [--max-model-len N] [--token-interval-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Callable
from typing import Any

import uvicorn

from rollyard.core.errors import ConfigError

# A reply chosen by the caller instead of the canned one: its token ids, their logprobs and its
# finish reason ("stop" or "length"). ``rollyard.rollout.sft_scripted.scripted_engine`` answers with these.
Reply = tuple[list[int], list[float], str]
Replier = Callable[[list[int], int], Reply]  # (prompt ids, max_tokens) -> reply


async def read_body(receive: Any) -> bytes:
    """The whole request body of a raw ASGI request (the canned engine's and the benches' relays)."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


def answer(body: dict[str, Any], replier: Replier | None = None) -> dict[str, Any]:
    """vLLM's non-streamed completion for ``body`` (token-id prompt): the completion's ids as
    ``token_ids`` with the prompt's echo (``return_token_ids``), its tokens as ``"token_id:N"``
    (``return_tokens_as_token_ids``) or as text, as vLLM writes them. The ids are canned (seeded
    from the prompt, ``max_tokens`` of them, finish ``length``) unless ``replier`` chooses them."""
    prompt = body.get("prompt") if isinstance(body, dict) else None
    ok = isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt)
    if not ok:
        raise ConfigError("the canned engine answers token-id prompts only")
    n = int(body.get("max_tokens") or 16)
    if replier is not None:
        ids, lps, finish_reason = replier(prompt, n)
        n = len(ids)
    else:
        rng = random.Random(hash(tuple(prompt)))
        ids = [rng.randrange(100, 900) for _ in range(n)]
        lps = [-round(rng.uniform(0.1, 5.0), 4) for _ in range(n)]
        finish_reason = "length"
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    choice: dict[str, Any] = {
        "index": 0,
        "text": "x" * n,
        "logprobs": {
            "text_offset": list(range(n)),
            "token_logprobs": lps,
            "tokens": [f"token_id:{t}" for t in ids] if as_ids else ["x"] * n,
            "top_logprobs": [None] * n,
        },
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if body.get("return_token_ids"):  # as vLLM: the completion's ids and the prompt's echo
        choice |= {"token_ids": ids, "prompt_token_ids": prompt}
    return {
        "id": "cmpl-canned",
        "object": "text_completion",
        "created": 0,
        "model": body.get("model", "tiny"),
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n},
    }


def stream_events(body: dict[str, Any], replier: Replier | None = None) -> list[bytes]:
    """``answer(body, replier)`` as vLLM streams it: an event per token (its id, logprob and
    text), the last with the finish reason, then one with the usage, then ``[DONE]``."""
    whole = answer(body, replier)
    choice = whole["choices"][0]
    lps, tokens = choice["logprobs"]["token_logprobs"], choice["logprobs"]["tokens"]
    ids = choice.get("token_ids")
    head = {k: whole[k] for k in ("id", "object", "created", "model")}
    events = []
    for i, (tok, lp) in enumerate(zip(tokens, lps, strict=True)):
        piece: dict[str, Any] = {
            "index": 0,
            "text": "x",
            "logprobs": {"text_offset": [i], "token_logprobs": [lp], "tokens": [tok], "top_logprobs": [None]},
            "finish_reason": choice["finish_reason"] if i == len(lps) - 1 else None,
            "stop_reason": None,
        }
        if ids is not None:  # return_token_ids: each piece's ids, the prompt's echo on the first
            piece["token_ids"] = [ids[i]]
            if i == 0:
                piece["prompt_token_ids"] = choice["prompt_token_ids"]
        events.append({**head, "choices": [piece]})
    events.append({**head, "choices": [], "usage": whole["usage"]})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def make_app(
    max_model_len: int = 2048,
    served_name: str = "tiny",
    token_interval_s: float = 0.0,
    replier: Replier | None = None,
) -> Any:
    card = {"id": served_name, "object": "model", "max_model_len": max_model_len}
    models = {"object": "list", "data": [card]}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = await read_body(receive)
        status, out, kind = 200, b"", b"application/json"
        path = scope["path"]
        if path == "/v1/completions":
            try:
                body = json.loads(raw)
                if isinstance(body, dict) and body.get("stream"):
                    await _stream(send, stream_events(body, replier), token_interval_s)
                    return
                out = json.dumps(answer(body, replier)).encode()
            except (ValueError, ConfigError) as e:
                status, out = 400, json.dumps({"error": {"message": str(e)}}).encode()
        elif path == "/v1/models":
            out = json.dumps(models).encode()
        elif path == "/metrics":
            out, kind = b"", b"text/plain"
        elif path != "/health":
            status, out = 404, b'{"error": {"message": "not found"}}'
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": out})

    return app


async def _stream(send: Any, events: list[bytes], interval_s: float) -> None:
    """Each event in a body message of its own, ``interval_s`` apart, as an engine sends tokens
    as it makes them."""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    for i, e in enumerate(events):
        if i and interval_s:
            await asyncio.sleep(interval_s)
        await send({"type": "http.response.body", "body": e, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--token-interval-ms", type=float, default=20.0, help="between streamed tokens")
    args = p.parse_args()
    app = make_app(args.max_model_len, token_interval_s=args.token_interval_ms / 1000)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
