"""``rollyard bench tree``: prefix-tree merged vs unmerged forward+backward, fp32, same workloads.

(a) group: ``small`` model, one 512-token prompt, 16 completions of 64 tokens (a GRPO group).
(b) multiturn: ``tiny`` model, 4 trajectories x 20 turns sharing a 256-token task prompt; each turn
    adds 32 completion and 32 tool-output tokens and every call is a sample whose prompt is the
    whole history so far (what a black-box agent's gateway records).
The earlier workloads at a quarter (group) and half (multiturn) of their lengths, with the same
token ratios (6.0 and 13.66), so that a whole run fits in ~10 minutes on 2 quiet cores.

Baseline: the same samples, each its own causal sequence, packed into micro-batches by the same
token budget, same attention kernel, same loss.

Time: one worker process per workload holds one model and runs the two variants interleaved in
rounds, ABBA (merged, unmerged | unmerged, merged | ...), so both see the same load; the figure is
the median of the per-round ratios, quoted with each round's load average
(``ROLLYARD_BENCH_TREE_ROUNDS``, default 3). Each step's time is split by phase (mask building,
forward, loss, backward; ``train.step.PHASES``).

Memory: a fresh process per variant runs one step and reports its RSS rise (``ru_maxrss`` is a
high-water mark, and torch's CPU allocations are invisible to tracemalloc).

Bounds: ``token_bound`` = unmerged / merged forwarded tokens; ``flop_ratio`` also counts attention
(each token attends to its ancestors, so a merged token sits deeper than the average unmerged one
and costs more): dense flops per token plus attention flops per (query, key) pair of the packed rows.
A first-order estimate, not a bound: measured speedups pass it (attention is cheaper per flop here).
``eff`` = speedup / token bound.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from rollyard.bench._report import report

logger = logging.getLogger(__name__)

WORKLOADS: dict[str, dict[str, Any]] = {
    "group": {"size": "small", "prompt": 512, "completions": 16, "completion": 64, "budget": 8192},
    "multiturn": {"size": "tiny", "prompt": 256, "trajectories": 4, "turns": 20, "turn": 32, "budget": 8192},
}
QUICK: dict[str, dict[str, Any]] = {
    "group": {"size": "tiny", "prompt": 512, "completions": 8, "completion": 64, "budget": 4096},
    "multiturn": {"size": "tiny", "prompt": 128, "trajectories": 4, "turns": 6, "turn": 32, "budget": 4096},
}
ROUNDS_ENV = "ROLLYARD_BENCH_TREE_ROUNDS"


def build_samples(name: str, spec: dict[str, Any], vocab: int, seed: int = 0) -> list[Any]:
    """The benchmark's samples: random token ids with the workload's sharing structure."""
    from rollyard.core import Sample

    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    def sample(prompt: list[int], completion: list[int], adv: float) -> Sample:
        ids = prompt + completion
        return Sample(
            token_ids=ids,
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            logprobs=[0.0] * len(prompt) + [-rng.random() * 4 for _ in completion],
            advantages=[adv] * len(ids),
        )

    prompt = toks(spec["prompt"])
    if name == "group":
        return [sample(prompt, toks(spec["completion"]), rng.gauss(0, 1)) for _ in range(spec["completions"])]
    out = []
    for _ in range(spec["trajectories"]):
        history = list(prompt)
        adv = rng.gauss(0, 1)
        for _ in range(spec["turns"]):
            completion = toks(spec["turn"])
            out.append(sample(history, completion, adv))
            history = history + completion + toks(spec["turn"])  # the tool's answer joins the history
    return out


def flops(packed: Any, config: Any) -> float:
    """Forward flops of a packed batch: dense per token, plus attention per (query, visible key) pair.

    A token at depth d attends to d + 1 keys; backward costs about twice both terms, so the ratio
    of two batches' flops is their cost ratio to first order."""
    h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = h // heads
    kv = config.num_key_value_heads * head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size
    dense = 2 * (layers * per_layer + h * config.vocab_size)
    pairs = sum(int((mb.position_ids + 1).sum()) for mb in packed.micro_batches)
    return float(dense * packed.forwarded_tokens + 4 * layers * heads * head_dim * pairs)


def _setup(name: str, quick: bool) -> tuple[Any, list[Any], dict[str, Any]]:
    import torch

    from rollyard.train import build_model, pack_samples, set_attention

    torch.set_num_threads(2)
    spec = (QUICK if quick else WORKLOADS)[name]
    model = build_model(spec["size"], seed=0, max_position_embeddings=8192)
    set_attention(model, "rollyard_tree")
    samples = build_samples(name, spec, model.config.vocab_size)
    budget = spec["budget"]
    packed = {
        v: pack_samples(samples, token_budget=budget, max_tree_tokens=budget, merge=v == "merged")
        for v in ("merged", "unmerged")
    }
    return model, samples, packed


def _step(model: Any, samples: list[Any], packed: Any) -> dict[str, Any]:
    """One timed forward+backward; gradients are cleared afterwards (each step starts from zero)."""
    import torch

    from rollyard.train.objective import LossConfig
    from rollyard.train.step import forward_backward

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    res = forward_backward(model, samples, packed, LossConfig(kind="ppo"), "rollyard_tree")
    seconds = time.perf_counter() - t0
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    model.zero_grad(set_to_none=True)
    phases = {k: round(v, 4) for k, v in res.phases.items()}
    phases["other"] = round(seconds - sum(res.phases.values()), 4)
    return {"seconds": seconds, "loss": res.loss, "grad_norm": grad_norm, "phases": phases}


def run_rounds(name: str, rounds: int, quick: bool) -> dict[str, Any]:
    """Both variants in this process, interleaved ABBA; one warm-up step of each first."""
    model, samples, packed = _setup(name, quick)
    bounds = {"tokens": {v: p.forwarded_tokens for v, p in packed.items()}}
    bounds["flops"] = {v: flops(p, model.config) for v, p in packed.items()}
    print(f"{name}: {bounds}", file=sys.stderr, flush=True)
    _step(model, samples, packed["merged"])
    first = [samples[i] for i in packed["unmerged"].micro_batches[0].samples]
    _step(model, first, _pack(first, "unmerged"))
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        order = ("merged", "unmerged") if r % 2 == 0 else ("unmerged", "merged")
        load = [os.getloadavg()[0]]
        row: dict[str, Any] = {"order": list(order)}
        for v in order:
            row[v] = _step(model, samples, packed[v])
        load.append(os.getloadavg()[0])
        row["ratio"] = row["unmerged"]["seconds"] / row["merged"]["seconds"]
        row["load_1m"] = load
        out.append(row)
        secs = {v: round(row[v]["seconds"], 2) for v in order}
        print(
            f"round {r}: {name} ratio={row['ratio']:.3f} seconds={secs} load={load}",
            file=sys.stderr,
            flush=True,
        )
    return {
        "rounds": out,
        "forwarded_tokens": bounds["tokens"],
        "micro_batches": {v: len(p.micro_batches) for v, p in packed.items()},
        "unmerged_tokens": packed["merged"].unmerged_tokens,
        "flops": bounds["flops"],
        "params": sum(p.numel() for p in model.parameters()),
        "samples": len(samples),
    }


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_memory(name: str, variant: str, quick: bool) -> dict[str, Any]:
    """One variant's step in this (fresh) process: the RSS rise over the model's own footprint."""
    model, samples, packed = _setup(name, quick)
    _step(model, samples[:1], _pack(samples[:1], variant))
    before = _rss_mib()
    step = _step(model, samples, packed[variant])
    peak = _rss_mib()
    return {"rss_peak_mib": peak, "rss_rise_mib": peak - before, "seconds": step["seconds"]}


def _pack(samples: list[Any], variant: str) -> Any:
    from rollyard.train import pack_samples

    return pack_samples(samples, token_budget=1 << 20, max_tree_tokens=1 << 20, merge=variant == "merged")


def _spawn(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rollyard.bench.tree", *args]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summarise(name: str, res: dict[str, Any]) -> dict[str, float]:
    rounds = res["rounds"]
    ratios = [r["ratio"] for r in rounds]
    tok = res["forwarded_tokens"]["unmerged"] / res["forwarded_tokens"]["merged"]
    flop = res["flops"]["unmerged"] / res["flops"]["merged"]
    speedup = statistics.median(ratios)
    return {
        f"speedup_{name}": speedup,
        f"token_bound_{name}": tok,
        f"flop_ratio_{name}": flop,
        f"eff_{name}": speedup / tok,
        f"load_{name}": statistics.median(x for r in rounds for x in r["load_1m"]),
    }


def main(quick: bool = False) -> dict[str, Any]:
    rounds = int(os.environ.get(ROUNDS_ENV, "3"))
    if rounds < 1:
        raise ValueError(f"{ROUNDS_ENV} must be >= 1")
    details: dict[str, Any] = {"workloads": QUICK if quick else WORKLOADS, "quick": quick, "rounds": rounds}
    flag = ["--quick"] if quick else []
    t0 = time.perf_counter()
    summary: dict[str, float] = {}
    for name in ("group", "multiturn"):
        details[name] = _spawn("rounds", name, str(rounds), *flag)
        summary.update(_summarise(name, details[name]))
        logger.info("bench tree %s: %s", name, summary)
    mem = {v: _spawn("memory", "group", v, *flag) for v in ("merged", "unmerged")}
    details["group_memory"] = mem
    summary["mem_ratio_group"] = mem["merged"]["rss_rise_mib"] / max(mem["unmerged"]["rss_rise_mib"], 1e-9)
    summary["loss_diff_max"] = max(
        abs(r["merged"]["loss"] - r["unmerged"]["loss"])
        for name in ("group", "multiturn")
        for r in details[name]["rounds"]
    )
    details["wall_s"] = time.perf_counter() - t0
    ordered = ("speedup_group", "speedup_multiturn", "mem_ratio_group")
    return report(
        "tree",
        {k: summary[k] for k in ordered} | {k: v for k, v in summary.items() if k not in ordered},
        details,
    )


if __name__ == "__main__":  # worker entry: JSON on the last stdout line
    args = sys.argv[1:]
    quick_flag = "--quick" in args
    if args[0] == "rounds":
        result = run_rounds(args[1], int(args[2]), quick_flag)
    else:
        result = run_memory(args[1], args[2], quick_flag)
    print(json.dumps(result), flush=True)
