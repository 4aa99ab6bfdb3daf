"""``rollyard bench engine``: tokens/s of VLLMBackend vs the in-process HFBackend.

Both serve the same model (the tiny one, or ``--model smollm2-135m``), same prompts, same
sampling, at concurrency 1, 16 and 64.
Throughput counts the tokens actually produced (a random model may stop early at eos), over
the wall time of the whole concurrent batch; each level is the median of three runs.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollyard.bench._model import TINY, bench_model, result_name
from rollyard.bench._report import report
from rollyard.core.sampling import SamplingParams
from rollyard.engines.base import Backend


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    return [[(31 * i + 7 * j) % (vocab - 10) + 5 for j in range(length)] for i in range(n)]


async def _throughput(
    backend: Backend, concurrency: int, prompts: list[list[int]], max_tokens: int
) -> dict[str, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(backend.generate(p, params) for p in prompts[:concurrency]))
    elapsed = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    return {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed}


async def _run(model_dir: Path, levels: list[int], max_tokens: int, repeats: int) -> dict[str, Any]:
    from rollyard.engines.hf import HFBackend
    from rollyard.engines.launcher import VLLMServer
    from rollyard.engines.vllm import VLLMBackend

    prompts = _prompts(max(levels), 64, 2000)
    out: dict[str, Any] = {"vllm": {}, "hf": {}}
    with VLLMServer(model_dir, max_model_len=1024) as server:
        vb = VLLMBackend(server.url)
        try:
            await _throughput(vb, 4, prompts, 8)  # warm-up
            for c in levels:
                runs = [await _throughput(vb, c, prompts, max_tokens) for _ in range(repeats)]
                out["vllm"][c] = {"tok_s": statistics.median(r["tok_s"] for r in runs), "runs": runs}
        finally:
            await vb.aclose()
    hb = HFBackend(model_dir, max_model_len=1024)
    for c in levels:
        runs = [await _throughput(hb, c, prompts, max_tokens) for _ in range(repeats)]
        out["hf"][c] = {"tok_s": statistics.median(r["tok_s"] for r in runs), "runs": runs}
    await hb.aclose()
    return out


def main(quick: bool = False, model: str = TINY) -> dict[str, Any]:
    levels = [1, 4] if quick else [1, 16, 64]
    max_tokens = 16 if quick else 64
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-engine-") as tmp:
        model_dir = bench_model(model, Path(tmp))
        res = asyncio.run(_run(model_dir, levels, max_tokens, repeats))
    top = max(levels)
    v, h = res["vllm"][top]["tok_s"], res["hf"][top]["tok_s"]
    summary: dict[str, Any] = {"concurrency": top, "vllm_tok_s": v, "hf_tok_s": h, "ratio": v / h}
    for c in levels:
        summary[f"vllm_tok_s_c{c}"] = res["vllm"][c]["tok_s"]
        summary[f"hf_tok_s_c{c}"] = res["hf"][c]["tok_s"]
    details = {"model": model, "levels": levels, "max_tokens": max_tokens, "repeats": repeats, "results": res}
    # The last line leads with the issue's keys; per-level figures are in the JSON.
    return report(
        result_name("engine", model),
        {k: summary[k] for k in ("vllm_tok_s", "hf_tok_s", "ratio")} | summary,
        details,
    )
