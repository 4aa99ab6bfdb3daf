"""``rollyard bench kvpool``'s ``pd`` phase: long-prompt programs with split prefill/decode roles
against colocated, on one pair of engines sharing ``engine.kv_pool: {kind: local}``.

The pair starts as a prefill engine (``kv_producer``) and a decode engine (``kv_both``).
Split: each program's prompt runs on the prefill engine with ``max_tokens`` 1 (what the gateway's
``PrefillStage`` sends), then streams from the decode engine, which loads the prompt's blocks
from the pool. Colocated: fresh prompts of the same size, each streamed whole from one of the two
engines in turn. The programs of a phase run at once. TTFT runs from the program's first call to
its first streamed token; decode tokens/s from that token to the last. The roles change nothing
in our connector's behaviour, so the colocated phase is a fair baseline on the same engines.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from rollyard.core.engine_key import engine_headers
from rollyard.engines.kvpool import KVPoolConfig
from rollyard.engines.kvpool.config import Role
from rollyard.engines.launcher import VLLMServer, start_together
from rollyard.engines.metrics import prompt_token_sources

PD_PROMPT = 900  # tokens per program's first prompt
PD_TOKENS = 48  # tokens each program decodes


def _prefill(url: str, prompt: list[int]) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    httpx.post(f"{url}/v1/completions", json=body, timeout=600.0, headers=engine_headers()).raise_for_status()


def _stream(url: str, prompt: list[int]) -> tuple[float, float, int]:
    """Stream a T=0 completion: (first token's time, last token's time, tokens)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": PD_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    first = last = 0.0
    n = 0
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, timeout=600.0, headers=engine_headers()
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                last = time.perf_counter()
                first = first or last
                n += 1
    return first, last, n


def _program(split: bool, prefill: str, decode: str, prompt: list[int], out: list[dict[str, float]]) -> None:
    start = time.perf_counter()
    if split:
        _prefill(prefill, prompt)
    first, last, n = _stream(decode, prompt)
    out.append({"ttft_s": first - start, "decode_tok_s": (n - 1) / (last - first) if last > first else 0.0})


def _phase(split: bool, urls: list[str], prompts: list[list[int]]) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    threads = [
        threading.Thread(target=_program, args=(split, urls[0], urls[1] if split else urls[i % 2], p, out))
        for i, p in enumerate(prompts)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pd_phase(
    model: Path, tmp: Path, root: Path, n: int, vocab: int, kv_tokens: int, max_len: int
) -> dict[str, Any]:
    """Split vs colocated on one prefill + decode pair; summary keys ``pd_*``."""
    pool = KVPoolConfig(kind="local", root=str(root))
    roles: tuple[Role, ...] = ("prefill", "decode")
    common: dict[str, Any] = dict(
        kv_tokens=kv_tokens, max_model_len=max_len, served_name="tiny", kv_pool=pool
    )
    servers = [
        VLLMServer(model, log_path=tmp / f"pd-{r}.log", startup_timeout_s=900.0, role=r, **common)
        for r in roles
    ]
    try:
        start_together(servers, tmp)
        urls = [s.url for s in servers]
        rng = random.Random(5)
        prompts = [[rng.randrange(10, vocab) for _ in range(PD_PROMPT)] for _ in range(2 * n)]
        before = prompt_token_sources(httpx.get(f"{urls[1]}/metrics", headers=engine_headers()).text)
        split = _phase(True, urls, prompts[:n])
        after = prompt_token_sources(httpx.get(f"{urls[1]}/metrics", headers=engine_headers()).text)
        colocated = _phase(False, urls, prompts[n:])
    finally:
        for s in servers:
            s.stop()

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "pd_ttft_ratio": med(split, "ttft_s") / med(colocated, "ttft_s"),
        "pd_decode_tok_s_ratio": med(split, "decode_tok_s") / med(colocated, "decode_tok_s"),
        "pd_ttft_s": med(split, "ttft_s"),
        "pd_colocated_ttft_s": med(colocated, "ttft_s"),
        "pd_decode_tok_s": med(split, "decode_tok_s"),
        "pd_colocated_decode_tok_s": med(colocated, "decode_tok_s"),
        "pd_decode_loaded": after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0),
        "pd_decode_computed": after.get("local_compute", 0) - before.get("local_compute", 0),
        "pd_programs": n,
    }
