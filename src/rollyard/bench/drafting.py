"""``rollyard bench drafting``: grouped speculative drafting against its baselines on real vLLM.

The model: the reading demo's SFT'd model (SmolLM2-135M-Instruct after the warm start of
``configs/demo-smollm2.yaml`` on scripted ``readout`` demonstrations; ``bench._readout``, cached
after the first run). It writes short structured tool calls, and the samples of one prompt repeat
each other as an RL policy's group does. Untuned SmolLM2 at T = 1 drifts into garbled text within
a few dozen tokens (5% of its tokens could be drafted, whatever the drafter), so the benchmark
before this one sampled it at T = 0.7.

Workload: real agent turns of ``readout`` tasks (the task prompt, then the prompt after each of
the scripted solver's tool calls and its real tool reply), each sampled by a group of G = 16 at
T = 1, groups in order, against four engines started one after another: (a) no drafting, (b) vLLM
``ngram`` (prompt lookup), (c) ours with no group (each request alone), (d) ours grouped, all with
k = 4; then (d) again at k = 2 and k = 8 with the adaptive length off, for the break-even
(``--quick``: concurrency 16 only, k = 8 only). Each concurrency level runs its own
tasks, so no group's index holds samples from an earlier level. vLLM turns async scheduling off
for a ``custom_class`` drafter (not for (a) or (b)): that cost is part of the measured ratio. The
result is written after every engine. Acceptance length (1 + accepted / drafts) comes from each
engine's ``/metrics``; decode speed is completion tokens / wall time of the whole workload. At
T = 0 every engine's outputs must be identical (drafting must not change what is sampled).

Then the eagle rows (``bench.drafting_eagle``, also ``rollyard bench drafting-eagle`` alone): the
learned head online, frozen, and grouped suffix over RL runs of the reading demo (``--steps``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rollyard.bench._readout import agent_turns, sft_key, sft_model
from rollyard.bench._readout import sft_config as sft_model_config
from rollyard.bench._report import loadavg, report
from rollyard.core.sampling import SamplingParams
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.metrics import acceptance

G = 16
K = 4
TEMPERATURE = 1.0
MAX_TOKENS = 48  # the reading demo's agent.max_tokens
TASKS_PER_LEVEL = 1  # a task = 3 turns = 3 groups of G; more overruns the ~15 min the lock allows a bench
READ_TIMEOUT_S = 3600.0  # a starved engine on a shared 2-core box can go minutes without a byte
METHODS = {"none": "a", "grouped_suffix": "d", "solo_suffix": "c", "ngram": "b"}  # run in this order


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


def main(quick: bool = False, steps: int | None = None) -> dict[str, Any]:
    """The suffix drafters' engines, then the eagle rows (``bench.drafting_eagle``: an RL run of
    ``steps`` steps each, default 20; ``--quick`` 2) added to the same result and last line."""
    from rollyard.bench.drafting_eagle import STEPS, eagle_rows

    doc = suffix_rows(quick)

    def done(eagle: dict[str, Any], details: dict[str, Any]) -> None:
        nonlocal doc
        doc = report("drafting", {**doc["summary"], **eagle}, {**doc["details"], "eagle": details})

    base = dict(doc)
    eagle_rows(quick, steps or (2 if quick else STEPS), lambda e, d: (doc.update(base), done(e, d)))
    return doc


def suffix_rows(quick: bool) -> dict[str, Any]:
    """The engines with no drafting, ngram and ours (alone, grouped, grouped at fixed k)."""
    levels = [16] if quick else [4, 16]
    sweep = [8] if quick else [2, 8]
    per_level = TASKS_PER_LEVEL
    t0 = time.perf_counter()
    load = [loadavg()]
    model = sft_model()  # the first run warm-starts it (minutes); later runs reuse the cache
    sft_s = time.perf_counter() - t0
    tasks = agent_turns(model, 1 + per_level * len(levels))
    greedy_prompts = tasks[0][:1]
    # one fresh set of tasks per level; each of a task's turns is a group of G samples
    level_prompts = {
        c: [turn for task in tasks[1 + i * per_level : 1 + (i + 1) * per_level] for turn in task]
        for i, c in enumerate(levels)
    }
    res: dict[str, Any] = {}
    greedy: dict[str, list[list[int]]] = {}
    details: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct after the reading demo's SFT warm start "
        f"(configs/demo-smollm2.yaml sft, readout demonstrations; cache key {sft_key(sft_model_config())})",
        "sft_or_cache_s": sft_s,
        "prompts": "readout agent turns (task prompt, then after each scripted tool call and its "
        "real tool reply), one group of G per turn",
        "prompt_tokens": {str(c): [len(p) for p in ps] for c, ps in level_prompts.items()},
        "temperature": TEMPERATURE,
        "group_size": G,
        "max_tokens": MAX_TOKENS,
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
            model, drafting, greedy_prompts if name in METHODS else [], level_prompts, MAX_TOKENS
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
