"""``rollyard bench drafting``: grouped speculative drafting against its baselines on real vLLM.

The model: the tiny model after a short SFT (``rollyard.train.sft.run_sft``) on templated
tool-use demonstrations (a user asks for a key of a config file; the assistant calls ``bash``
with a grep, then reports the key's value in a fixed multi-line form with one of a few
phrasings in it), so at T = 1 it writes
repetitive structured text with varied slots, as a policy warm-started on a task family does.
It is made once per recipe and cached under ``.cache/bench-models``.

Workload: P prompts x G = 16 samples at T = 1, one group after another, at concurrency 4 and
16, against four engines started one after another on the same model: (a) no drafting,
(b) vLLM ``ngram`` (prompt lookup), (c) ours with no group (each request alone), (d) ours
grouped. Acceptance length (1 + accepted / drafts) comes from each engine's ``/metrics``;
decode speed is completion tokens / wall time of the whole workload. At T = 0 the four engines'
outputs on the same prompts must be identical (drafting must not change what is sampled).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

from rollyard.bench._report import loadavg, report
from rollyard.core.sampling import SamplingParams
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.metrics import acceptance

G = 16
SFT_LR, SFT_DEMOS = 3e-3, 400
METHODS = {"none": "a", "ngram": "b", "solo_suffix": "c", "grouped_suffix": "d"}
KEYS = ["color", "port", "owner", "region", "timeout", "level", "mode", "limit", "codec", "zone"]
VALUES = ["teal", "8080", "alice", "eu-west", "30s", "debug", "fast", "512", "opus", "b"]
PHRASES = [
    "The {k} is {v}.",
    "I found it: {k} = {v}.",
    "According to config.ini, the {k} is set to {v}.",
    "The value of {k} in config.ini is {v}.",
]
REPORT = (
    "I ran grep on config.ini and found the setting.\n- key: {k}\n- value: {v}\n- file: config.ini\n"
    "- line: {k}={v}\n{phrase}\nLet me know if you need any other value from config.ini."
)


def _conversation(key: str, value: str, rng: random.Random) -> tuple[list[dict[str, Any]], str]:
    from rollyard.engines import format_tool_call

    call = format_tool_call("bash", {"cmd": f"grep {key}= config.ini"})
    msgs = [
        {"role": "user", "content": f"What is the {key} in config.ini? Use the bash tool."},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": f"{key}={value}"},
    ]
    phrase = rng.choice(PHRASES).format(k=key, v=value)
    return msgs, REPORT.format(k=key, v=value, phrase=phrase)


def _demonstrations(tok: Any, n: int, seed: int) -> list[dict[str, list[int]]]:
    """Both turns of each conversation, as (prompt, completion) token ids."""
    from rollyard.engines import render_conversation

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key, value = rng.choice(KEYS), rng.choice(VALUES)
        msgs, answer = _conversation(key, value, rng)
        for upto, completion in ((1, msgs[1]["content"]), (3, answer)):
            prompt = render_conversation(msgs[:upto], add_generation_prompt=True)
            full = render_conversation(
                [*msgs[:upto], {"role": "assistant", "content": completion}], add_generation_prompt=False
            )
            p_ids = tok.encode(prompt, add_special_tokens=False)
            f_ids = tok.encode(full, add_special_tokens=False)
            if f_ids[: len(p_ids)] == p_ids:
                out.append({"prompt_ids": p_ids, "completion_ids": f_ids[len(p_ids) :]})
    return out


def bench_model(steps: int) -> Path:
    """The SFT'd tiny model, made once per version of its demonstrations and cached."""
    from transformers import AutoTokenizer

    from rollyard.engines.tiny_model import create_model
    from rollyard.train.sft import run_sft

    recipe = json.dumps([KEYS, VALUES, PHRASES, REPORT, steps, SFT_LR, SFT_DEMOS])
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    root = Path(".cache/bench-models") / f"drafting-{key}-{steps}"
    done = root / "model.json"
    if done.is_file():
        return Path(json.loads(done.read_text())["weights"])
    base = create_model(root / "base", seed=0, size="tiny", overwrite=True)
    tok = AutoTokenizer.from_pretrained(base)
    data = root / "demos.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in _demonstrations(tok, SFT_DEMOS, seed=0)))
    res = run_sft(base, data, root / "sft", steps=steps, batch_size=16, lr=SFT_LR, seed=0)
    done.write_text(json.dumps({"weights": res["weights"], "losses": res["losses"][-5:]}))
    return Path(res["weights"])


def _prompts(model: Path, n: int) -> list[list[int]]:
    """Second-turn prompts (after the tool result) for ``n`` keys the model was trained on."""
    from transformers import AutoTokenizer

    from rollyard.engines import render_conversation

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(1)
    out = []
    for i in range(n):
        msgs, _ = _conversation(KEYS[i], VALUES[(i + 3) % len(VALUES)], rng)
        out.append(
            tok.encode(render_conversation(msgs, add_generation_prompt=True), add_special_tokens=False)
        )
    return out


async def _workload(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Every prompt G times at T = 1, groups in order, ``concurrency`` requests at a time."""
    from rollyard.engines.vllm import VLLMBackend

    backend = VLLMBackend(url, max_model_len=2048)
    gate = asyncio.Semaphore(concurrency)

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0)

    async def one(prompt: list[int]) -> int:
        async with gate:
            return len((await backend.generate(prompt, params)).token_ids)

    try:
        before = [await backend.stats()]
        t0 = time.perf_counter()
        lengths = await asyncio.gather(*(one(p) for p in prompts for _ in range(G)))
        wall = time.perf_counter() - t0
        drafted = acceptance(before, [await backend.stats()])
    finally:
        await backend.aclose()
    tokens = sum(lengths)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, **drafted}


async def _greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    from rollyard.engines.vllm import VLLMBackend

    backend = VLLMBackend(url, max_model_len=2048)
    try:
        params = SamplingParams(max_tokens=48, temperature=0.0)
        return [(await backend.generate(p, params)).token_ids for p in prompts]
    finally:
        await backend.aclose()


def _run_engine(
    model: Path, method: str, k: int, prompts: list[list[int]], levels: list[int], max_tokens: int
) -> tuple[list[list[int]], dict[int, dict[str, Any]]]:
    from rollyard.engines.launcher import VLLMServer

    drafting = DraftingConfig(method=method, k=k)  # type: ignore[arg-type]
    with VLLMServer(
        model, max_model_len=2048, kv_tokens=16384, drafting=drafting, startup_timeout_s=600
    ) as s:
        greedy = asyncio.run(_greedy(s.url, prompts))
        runs = {c: asyncio.run(_workload(s.url, prompts, c, max_tokens)) for c in levels}
    return greedy, runs


def main(quick: bool = False) -> dict[str, Any]:
    k = 4
    levels = [16] if quick else [4, 16]
    n_prompts, max_tokens, sft_steps = (1, 48, 40) if quick else (2, 64, 40)
    t0 = time.perf_counter()
    model = bench_model(sft_steps)
    prompts = _prompts(model, n_prompts)
    load = [loadavg()]
    res: dict[str, Any] = {}
    greedy: dict[str, list[list[int]]] = {}
    for method in METHODS:
        greedy[method], res[method] = _run_engine(model, method, k, prompts, levels, max_tokens)
        load.append(loadavg())
    top = max(levels)

    def accept(method: str, c: int = top) -> float:
        return float(res[method][c].get("spec_acceptance_len", 1.0))

    summary: dict[str, Any] = {
        "accept_grouped": accept("grouped_suffix"),
        "accept_alone": accept("solo_suffix"),
        "accept_ngram": accept("ngram"),
        "tok_s_ratio": res["grouped_suffix"][top]["tok_s"] / res["none"][top]["tok_s"],
    }
    for c in levels:
        for method in ("ngram", "solo_suffix", "grouped_suffix"):
            summary[f"tok_s_ratio_{METHODS[method]}_c{c}"] = res[method][c]["tok_s"] / res["none"][c]["tok_s"]
        summary[f"accept_grouped_c{c}"] = accept("grouped_suffix", c)
    summary["t0_identical"] = all(greedy[m] == greedy["none"] for m in METHODS)
    summary["loadavg"] = load[-1].split()[0]
    details = {
        "model": f"tiny (3.5M Llama) after {sft_steps} SFT steps on templated tool-use demonstrations",
        "group_size": G,
        "prompts": n_prompts,
        "max_tokens": max_tokens,
        "k": k,
        "levels": levels,
        "results": {m: {str(c): r for c, r in runs.items()} for m, runs in res.items()},
        "loadavg_per_engine": load,
        "wall_s": time.perf_counter() - t0,
    }
    return report("drafting", summary, details)
