"""``rollyard bench tree``: prefix-tree merged vs unmerged forward+backward, fp32, same workloads.

(a) group: ``small`` model, one 2048-token prompt, 16 completions of 256 tokens (a GRPO group).
(b) multiturn: ``tiny`` model, 8 trajectories x 20 turns sharing a 512-token task prompt; each turn
    adds 64 completion and 64 tool-output tokens and every call is a sample whose prompt is the
    whole history so far (what a black-box agent's gateway records).

Baseline: the same samples, each its own causal sequence, packed into micro-batches by the same
token budget, same attention kernel, same loss. Each variant runs in a fresh subprocess so its
peak memory is its own: torch's CPU allocations are invisible to tracemalloc, so we read the
process's RSS high-water mark (``ru_maxrss``) before and after the step and report the rise
(activation memory) and the peak. The 1-minute load average is recorded around each variant:
on shared cores, time ratios are only as good as the load was steady.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

from rollyard.bench._report import report

logger = logging.getLogger(__name__)

WORKLOADS: dict[str, dict[str, Any]] = {
    "group": {"size": "small", "prompt": 2048, "completions": 16, "completion": 256, "budget": 16384},
    "multiturn": {"size": "tiny", "prompt": 512, "trajectories": 8, "turns": 20, "turn": 64, "budget": 16384},
}
QUICK: dict[str, dict[str, Any]] = {
    "group": {"size": "tiny", "prompt": 512, "completions": 8, "completion": 64, "budget": 4096},
    "multiturn": {"size": "tiny", "prompt": 128, "trajectories": 4, "turns": 6, "turn": 32, "budget": 4096},
}


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


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_variant(name: str, merged: bool, quick: bool) -> dict[str, Any]:
    """One variant in this process: build, warm up on one micro-batch, then time the full step."""
    import torch

    from rollyard.train import build_model, pack_samples, set_attention
    from rollyard.train.objective import LossConfig
    from rollyard.train.step import forward_backward

    torch.set_num_threads(2)
    spec = (QUICK if quick else WORKLOADS)[name]
    model = build_model(spec["size"], seed=0, max_position_embeddings=8192)
    set_attention(model, "rollyard_tree")
    samples = build_samples(name, spec, model.config.vocab_size)
    budget = spec["budget"]
    packed = pack_samples(samples, token_budget=budget, max_tree_tokens=budget, merge=merged)
    loss = LossConfig(kind="ppo")
    warm = pack_samples(samples[:1], token_budget=budget, merge=merged)
    forward_backward(model, samples[:1], warm, loss, "rollyard_tree")
    model.zero_grad(set_to_none=True)
    rss_before = _rss_mib()
    t0 = time.perf_counter()
    res = forward_backward(model, samples, packed, loss, "rollyard_tree")
    seconds = time.perf_counter() - t0
    rss_peak = _rss_mib()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    return {
        "seconds": seconds,
        "loss": res.loss,
        "grad_norm": grad_norm,
        "rss_peak_mib": rss_peak,
        "rss_rise_mib": rss_peak - rss_before,
        "samples": len(samples),
        "forwarded_tokens": packed.forwarded_tokens,
        "unmerged_tokens": packed.unmerged_tokens,
        "micro_batches": len(packed.micro_batches),
        "params": sum(p.numel() for p in model.parameters()),
    }


def _spawn(name: str, merged: bool, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rollyard.bench.tree", name, "merged" if merged else "unmerged"]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> dict[str, Any]:
    details: dict[str, Any] = {"workloads": QUICK if quick else WORKLOADS, "quick": quick}
    for name in ("group", "multiturn"):
        for merged in (True, False):
            key = f"{name}_{'merged' if merged else 'unmerged'}"
            load_before = os.getloadavg()[0]
            details[key] = _spawn(name, merged, quick)
            details[key]["load_avg_1m"] = [load_before, os.getloadavg()[0]]
            logger.info("bench tree %s: %s", key, details[key])
    g_m, g_u = details["group_merged"], details["group_unmerged"]
    t_m, t_u = details["multiturn_merged"], details["multiturn_unmerged"]
    summary = {
        "speedup_group": g_u["seconds"] / g_m["seconds"],
        "speedup_multiturn": t_u["seconds"] / t_m["seconds"],
        "mem_ratio_group": g_m["rss_rise_mib"] / max(g_u["rss_rise_mib"], 1e-9),
        "token_ratio_group": g_u["forwarded_tokens"] / g_m["forwarded_tokens"],
        "token_ratio_multiturn": t_u["forwarded_tokens"] / t_m["forwarded_tokens"],
        "loss_diff_max": max(abs(g_m["loss"] - g_u["loss"]), abs(t_m["loss"] - t_u["loss"])),
    }
    return report("tree", summary, details)


if __name__ == "__main__":  # worker entry: one variant, JSON on the last stdout line
    args = sys.argv[1:]
    result = run_variant(args[0], args[1] == "merged", "--quick" in args)
    print(json.dumps(result), flush=True)
