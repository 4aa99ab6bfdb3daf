"""``rollyard bench drafting``: grouped speculative drafting against its baselines on real vLLM.

The model: SmolLM2-135M-Instruct (``rollyard model init --from smollm2-135m``), a real
pretrained model, not SFT'd further. Its samples of one prompt share much text (the restated
question, the same steps, the same phrases), as a policy's group does in RL. The 3.5M tiny
model after a short SFT did not: at T = 1 its samples were near-random text (acceptance 1.03-1.24
for every drafter, ``bench/results/drafting.json`` before this version).

Workload: groups of G = 16 samples of one short reasoning question at T = 0.7 (a usual rollout
temperature for a small model; at T = 1 this 135M model drifts into garbled text within a few
dozen tokens, which no RL run would train on), against four engines started one after another:
(a) no drafting, (b) vLLM ``ngram`` (prompt lookup), (c) ours with no group (each request alone),
(d) ours grouped, all with k = 4; then (d) again at k = 2 and k = 8 with the adaptive length off,
for the break-even (``--quick``: concurrency 16 only, 48 tokens, k = 8 only). Each concurrency
level runs its own question, so no group's index holds samples from an earlier level. vLLM
turns async scheduling off for a ``custom_class`` drafter (not for (a) or (b)): that cost is
part of the measured ratio. The result is written after every engine. Acceptance length
(1 + accepted / drafts) comes from each engine's ``/metrics``; decode speed is completion
tokens / wall time of the whole workload. At T = 0 every engine's outputs must be identical
(drafting must not change what is sampled).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rollyard.bench._model import bench_model
from rollyard.bench._report import loadavg, report
from rollyard.core.sampling import SamplingParams
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.metrics import acceptance

G = 16
K = 4
TEMPERATURE = 0.7
MODEL = "smollm2-135m"
READ_TIMEOUT_S = 3600.0  # a starved engine on a shared 2-core box can go minutes without a byte
METHODS = {"none": "a", "grouped_suffix": "d", "solo_suffix": "c", "ngram": "b"}  # run in this order
QUESTIONS = [
    "Tom has 3 boxes with 12 pencils each. He gives away 7 pencils. How many pencils are left? "
    "Think step by step.",
    "A train travels 60 km in 45 minutes. What is its average speed in km per hour? Explain.",
    "Sara reads 15 pages a day. How many days does she need for a 240-page book? Show your work.",
    "A shop sells pens at 3 for 2 dollars. How much do 18 pens cost? Explain your reasoning.",
    "What is 25% of 360? Explain how you compute it.",
]


def _prompts(model: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from rollyard.engines import render_conversation

    tok = AutoTokenizer.from_pretrained(model)
    return [
        tok.encode(
            render_conversation([{"role": "user", "content": q}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]


async def _workload(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Every prompt G times, groups in order, ``concurrency`` requests at a time."""
    from rollyard.engines.vllm import VLLMBackend

    backend = VLLMBackend(url, max_model_len=2048, timeout_s=READ_TIMEOUT_S)
    gate = asyncio.Semaphore(concurrency)
    params = SamplingParams(max_tokens=max_tokens, temperature=TEMPERATURE)

    async def one(prompt: list[int]) -> list[int]:
        async with gate:
            return list((await backend.generate(prompt, params)).token_ids)

    try:
        before = [await backend.stats()]
        t0 = time.perf_counter()
        outputs = await asyncio.gather(*(one(p) for p in prompts for _ in range(G)))
        wall = time.perf_counter() - t0
        drafted = acceptance(before, [await backend.stats()])
    finally:
        await backend.aclose()
    tokens = sum(len(o) for o in outputs)
    # acceptance length counts only steps that drafted; the share of all tokens that came from
    # accepted drafts says how much of the decoding the drafter took over
    share = drafted.get("spec_accepted_tokens", 0) / max(tokens, 1)
    load1 = loadavg().split()[0]
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "accepted_share": share,
        "load1": load1,
        "outputs": outputs,
        **drafted,
    }


def _replayed(
    drafting: DraftingConfig, prompts: list[list[int]], outputs: list[list[int]], concurrency: int
) -> dict[str, float]:
    """The same samples replayed offline through the same drafter (``bench._replay``): what
    the live engine's acceptance should be if it drafted as the replay does."""
    from types import SimpleNamespace

    from rollyard.bench._replay import ReplayStats, replay
    from rollyard.engines.drafting import DrafterSettings, GroupedSuffixDrafter, SoloSuffixDrafter

    cls = GroupedSuffixDrafter if drafting.method == "grouped_suffix" else SoloSuffixDrafter
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=drafting.k),
        model_config=SimpleNamespace(max_model_len=2048),
    )
    drafter = cls(vllm_config, DrafterSettings.from_env(drafting.environment()))
    runs = [replay(drafter, p, outputs[j * G : (j + 1) * G], concurrency) for j, p in enumerate(prompts)]
    total = ReplayStats(*(sum(getattr(r, f) for r in runs) for f in ("drafts", "accepted", "tokens")))
    return {"replay_acceptance_len": total.acceptance_len, "replay_share": total.share}


async def _greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    from rollyard.engines.vllm import VLLMBackend

    backend = VLLMBackend(url, max_model_len=2048)
    try:
        params = SamplingParams(max_tokens=32, temperature=0.0)
        return [(await backend.generate(p, params)).token_ids for p in prompts]
    finally:
        await backend.aclose()


def _run_engine(
    model: Path,
    drafting: DraftingConfig,
    greedy_prompts: list[list[int]],
    level_prompts: dict[int, list[list[int]]],
    max_tokens: int,
) -> tuple[list[list[int]], dict[int, dict[str, Any]]]:
    from rollyard.engines.launcher import VLLMServer

    with VLLMServer(
        model, max_model_len=2048, kv_tokens=16384, drafting=drafting, startup_timeout_s=600
    ) as s:
        greedy = asyncio.run(_greedy(s.url, greedy_prompts)) if greedy_prompts else []
        runs = {c: asyncio.run(_workload(s.url, p, c, max_tokens)) for c, p in level_prompts.items()}
    if drafting.method in ("grouped_suffix", "solo_suffix"):
        for c, r in runs.items():
            r.update(_replayed(drafting, level_prompts[c], r["outputs"], c))
    return greedy, runs


def _summary(res: dict[str, Any], greedy: dict[str, list[list[int]]], levels: list[int]) -> dict[str, Any]:
    """The result line from the engines run so far (a method not run yet is left out)."""
    top = max(levels)

    def accept(method: str, c: int = top) -> float:
        return float(res[method][c].get("spec_acceptance_len", 1.0))

    def ratio(method: str, c: int = top) -> float:
        return float(res[method][c]["tok_s"] / res["none"][c]["tok_s"])

    summary: dict[str, Any] = {}
    for key, method in (
        ("accept_grouped", "grouped_suffix"),
        ("accept_alone", "solo_suffix"),
        ("accept_ngram", "ngram"),
    ):
        if method in res:
            summary[key] = accept(method)
    if "grouped_suffix" in res:
        summary["tok_s_ratio"] = ratio("grouped_suffix")
    for c in levels:
        for method in res:
            if method != "none":
                summary[f"tok_s_ratio_{METHODS.get(method, method)}_c{c}"] = ratio(method, c)
        for name, method in (("grouped", "grouped_suffix"), ("alone", "solo_suffix")):
            if method in res:
                summary[f"accept_{name}_c{c}"] = accept(method, c)
                summary[f"share_{name}_c{c}"] = float(res[method][c]["accepted_share"])
                summary[f"replay_accept_{name}_c{c}"] = float(res[method][c]["replay_acceptance_len"])
                summary[f"replay_share_{name}_c{c}"] = float(res[method][c]["replay_share"])
    summary["t0_identical"] = all(g == greedy["none"] for g in greedy.values())
    summary["complete"] = all(m in res for m in METHODS)
    return summary


def main(quick: bool = False) -> dict[str, Any]:
    levels = [16] if quick else [4, 16]
    sweep = [8] if quick else [2, 8]
    max_tokens = 48 if quick else 64
    t0 = time.perf_counter()
    model = bench_model(MODEL, Path(".cache/bench-models"))  # converted once, offline from pip's cache
    prompts = _prompts(model)
    greedy_prompts = prompts[:1]
    level_prompts = {c: [prompts[1 + i]] for i, c in enumerate(levels)}  # one fresh group per level
    load = [loadavg()]
    res: dict[str, Any] = {}
    greedy: dict[str, list[list[int]]] = {}
    details: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct (rollyard model init --from smollm2-135m), no further SFT",
        "temperature": TEMPERATURE,
        "group_size": G,
        "questions": {str(c): QUESTIONS[1 + i] for i, c in enumerate(levels)},
        "max_tokens": max_tokens,
        "k": K,
        "k_sweep": sweep,
        "levels": levels,
        "results": res,
        "loadavg_per_engine": load,
    }
    engines: list[tuple[str, DraftingConfig]] = [
        (m, DraftingConfig(method=m, k=K))  # type: ignore[arg-type]
        for m in METHODS
    ]
    # fixed draft length (the budget never binds): where drafting stops paying
    engines += [(f"grouped_k{k}", DraftingConfig(method="grouped_suffix", k=k, budget=k * G)) for k in sweep]
    doc: dict[str, Any] = {}
    for name, drafting in engines:
        g, runs = _run_engine(
            model, drafting, greedy_prompts if name in METHODS else [], level_prompts, max_tokens
        )
        if name in METHODS:
            greedy[name] = g
        res[name] = {str(c): r for c, r in runs.items()}
        load.append(loadavg())
        details["wall_s"] = time.perf_counter() - t0
        # written after every engine, so a run cut short still leaves what it measured
        summary = _summary({m: {int(c): r for c, r in v.items()} for m, v in res.items()}, greedy, levels)
        summary["loadavg"] = load[-1].split()[0]
        doc = report("drafting", summary, details)
    return doc
