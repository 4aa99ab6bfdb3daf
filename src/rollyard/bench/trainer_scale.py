"""``rollyard bench trainer-scale``: the trainer's memory at cluster scale, each feature beside its baseline.

- ``fsdp_weight_diff``, ``rank_state_ratio``: 2 gloo FSDP2 ranks vs one process after 3 steps on
  uneven tree batches (``bench/_fsdp.py``): largest weight difference, and per-rank parameter +
  gradient + optimizer bytes over one process's.
- ``logits_peak_gb``, ``logits_peak_ratio``: the loss step (logprobs, loss, backward into the hidden
  states and the head) of one 4,096-token micro-batch (a GRPO group: 1,024-token prompt, 8 x 384
  completions) with SmolLM2's head (vocab 49,152, hidden 576, random weights): the chunked head
  (``trainer.logits_chunk``, default) vs the full (L, V) logits. torch on CPU has no
  ``max_memory_allocated`` and its allocations are invisible to tracemalloc, so each variant runs
  in a fresh process and reports its RSS high-water rise (``VmHWM``, reset before the step) over
  the inputs' footprint; freed pages count as long as they were touched at the peak, which is what
  we want.
- ``mask_build_s_32k``, ``mask_mb_32k``: the flex ``BlockMask`` of a 32,768-token forest (8 such
  groups) built from the DFS ranges: median wall time of 5 builds, and its memory: the larger of
  the RSS high-water rise of the builds in a fresh process that loads only the ranges (packing
  happens in the parent) and the traced numpy peak of one build plus the bytes of the mask's
  tensors.
  Baseline beside it: ``create_block_mask`` (every (q, kv) pair evaluated) at 4,096 tokens; at
  32k it took 38 s and 11.4 GB here, too much to rerun on a shared 24 GB host.
- ``plan_7b_headroom_gb``: ``rollyard plan``'s headroom for Qwen2.5-7B, bf16, FSDP2, activation
  checkpointing, 8 x 80 GB, the trainer's default token budget.
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

from rollyard.bench._report import loadavg, report

VOCAB, HIDDEN = 49_152, 576  # SmolLM2-135M's head
COMPLETIONS = 8  # one group of 4,096 tokens: a 1,024-token prompt + 8 x 384
QUICK_SCALE = 4  # --quick: every length / 4


def _group_forest(tokens: int, groups: int, vocab: int, seed: int = 0) -> Any:
    """One packed row of ``groups`` GRPO groups, ``tokens`` tokens each (a quarter of them prompt)."""
    from rollyard.core import Sample
    from rollyard.train import pack_samples

    rng = random.Random(seed)
    prompt_len = tokens // 4
    comp_len = (tokens - prompt_len) // COMPLETIONS
    samples = []
    for _ in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        for _ in range(COMPLETIONS):
            ids = prompt + [rng.randrange(vocab) for _ in range(comp_len)]
            n = len(ids)
            samples.append(
                Sample(
                    token_ids=ids,
                    loss_mask=[0] * prompt_len + [1] * comp_len,
                    logprobs=[0.0] * n,
                    advantages=[1.0] * n,
                )
            )
    return pack_samples(samples, token_budget=1 << 22, max_tree_tokens=1 << 22).micro_batches[0]


def _status_mb(field: str) -> float:
    """One ``/proc/self/status`` line (``VmRSS``, ``VmHWM``: kB), MB (1e6 B)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_start() -> float:
    """Start a peak measurement here: the RSS high-water mark is reset to the current RSS (writing
    5 to ``clear_refs``), so the rise is over what is resident now, not over an earlier peak (the
    imports' or the inputs' build, which a small step stays under: a rise of 0). Where the reset is
    not allowed, the rise is over the old high-water mark (``ru_maxrss``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_mb("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # Linux: KiB


def _peak_rise(start: float) -> float:
    """The RSS high-water rise since ``_peak_start``, MB."""
    try:
        return _status_mb("VmHWM") - start
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6 - start


def run_logits(variant: str, tokens: int) -> dict[str, Any]:
    """One loss step of one variant in this (fresh) process: its RSS rise over the inputs."""
    import torch

    from rollyard.train.logprobs import chunked_logprobs, sample_logprobs
    from rollyard.train.trainer import TrainConfig

    torch.set_num_threads(2)
    chunk = TrainConfig().logits_chunk
    mb = _group_forest(tokens, 1, VOCAB)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(mb.num_tokens, HIDDEN, generator=gen).requires_grad_()
    head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).requires_grad_()

    def step() -> float:
        if variant == "full":
            lps, _ = sample_logprobs(torch.nn.functional.linear(hidden, head), mb)
        else:
            lps, _ = chunked_logprobs(hidden, head, mb, chunk=chunk)
        loss = torch.stack([lp.sum() for lp in lps]).sum()
        loss.backward()
        return float(loss.detach())

    before = _peak_start()
    t0 = time.perf_counter()
    loss = step()
    seconds = time.perf_counter() - t0
    return {
        "rss_rise_mb": _peak_rise(before),
        "seconds": seconds,
        "loss": loss,
        "head_grad_norm": float(head.grad.norm()),  # type: ignore[union-attr]
        "tokens": mb.num_tokens,
        "chunk": chunk if variant == "chunked" else 0,
    }


def run_mask(variant: str, path: str) -> dict[str, Any]:
    """Build the flex BlockMask of the DFS ranges saved at ``path`` in this (fresh) process, whose
    earlier peak is only its imports: build time and RSS rise."""
    import numpy as np
    import torch

    from rollyard.train.flex_mask import ranges_block_mask

    torch.set_num_threads(2)
    end = np.load(path)
    n = int(end.shape[0])
    ranges_block_mask(np.arange(1, 257), "cpu")  # imports and first-call set-up out of the way
    if variant == "create":
        from torch.nn.attention.flex_attention import create_block_mask

        end_t = torch.from_numpy(end)

        def build() -> Any:
            return create_block_mask(
                lambda b, h, q, kv: (kv <= q) & (q < end_t[kv]), None, None, n, n, device="cpu"
            )

    else:

        def build() -> Any:
            return ranges_block_mask(end, "cpu")

    before = _peak_start()
    times = []
    for _ in range(5 if variant == "ranges" else 1):
        t0 = time.perf_counter()
        mask = build()
        times.append(time.perf_counter() - t0)
    rise = _peak_rise(before)
    tracemalloc.start()  # numpy's temporaries are traced (torch's are not; the mask's own are below)
    mask = build()
    traced = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    tensors = [mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices]
    tensors += [mask.q_num_blocks, mask.q_indices, mask.full_q_num_blocks, mask.full_q_indices]
    return {
        "tokens": n,
        "seconds": statistics.median(times),
        "seconds_all": times,
        "rss_rise_mb": rise,
        "numpy_peak_mb": traced,
        "mask_tensor_mb": sum(t.numel() * t.element_size() for t in tensors if t is not None) / 1e6,
        "full_blocks": int(mask.full_kv_num_blocks.sum()),
        "partial_blocks": int(mask.kv_num_blocks.sum()),
    }


def _saved_forest(tmp: str, tokens: int) -> str:
    """Pack a forest of ``tokens`` tokens (4,096-token groups) here; save its DFS ranges for a worker."""
    import numpy as np

    groups, size = (tokens // 4096, 4096) if tokens >= 4096 else (1, tokens)
    path = f"{tmp}/ranges-{tokens}.npy"
    np.save(path, _group_forest(size, groups, 50_000).subtree_end)
    return path


def plan_7b() -> dict[str, Any]:
    from rollyard.train.plan import PlanSetup, model_config, plan_memory

    setup = PlanSetup(
        world_size=8, dtype="bf16", parallel="fsdp2", activation_checkpointing=True, gpu_mem_gb=80
    )
    plan = plan_memory(model_config("qwen2.5-7b"), setup, name="qwen2.5-7b")
    return {"headroom_gb": plan.headroom_gb, "rows_gb": {k: v / 1e9 for k, v in plan.rows.items()}}


def fsdp_figures(tmpdir: str) -> dict[str, float]:
    """``fsdp_weight_diff`` and ``rank_state_ratio`` from the FSDP2 side of the trainer."""
    from rollyard.bench._fsdp import measure_fsdp

    return measure_fsdp(tmpdir)


def _spawn(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rollyard.bench.trainer_scale", *args]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> dict[str, Any]:
    scale = QUICK_SCALE if quick else 1
    logit_tokens, mask_tokens, create_tokens = 4096 // scale, 32_768 // scale, 4096 // scale
    details: dict[str, Any] = {"quick": quick, "load_start": loadavg()}
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-fsdp-") as tmp:
        fsdp = fsdp_figures(tmp)
    details["fsdp"] = fsdp
    summary.update({k: fsdp[k] for k in ("fsdp_weight_diff", "rank_state_ratio") if k in fsdp})
    logits = {v: _spawn("logits", v, str(logit_tokens)) for v in ("full", "chunked")}
    details["logits"] = logits
    summary["logits_peak_gb"] = logits["chunked"]["rss_rise_mb"] / 1000
    summary["logits_peak_ratio"] = logits["chunked"]["rss_rise_mb"] / max(logits["full"]["rss_rise_mb"], 1e-9)
    details["logits_loss_diff"] = abs(logits["chunked"]["loss"] - logits["full"]["loss"])
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-mask-") as tmp:
        big, small = _saved_forest(tmp, mask_tokens), _saved_forest(tmp, create_tokens)
        mask = {"ranges": _spawn("mask", "ranges", big)}
        mask["ranges_at_baseline_size"] = _spawn("mask", "ranges", small)
        mask["create_block_mask"] = _spawn("mask", "create", small)
    details["mask"] = mask
    summary["mask_build_s_32k"] = mask["ranges"]["seconds"]
    built = mask["ranges"]
    summary["mask_mb_32k"] = max(built["rss_rise_mb"], built["numpy_peak_mb"] + built["mask_tensor_mb"])
    details["plan_7b"] = plan_7b()
    summary["plan_7b_headroom_gb"] = details["plan_7b"]["headroom_gb"]
    details["load_end"] = loadavg()
    return report("trainer-scale", summary, details)


if __name__ == "__main__":  # worker entry: JSON on the last stdout line
    kind, which, arg = sys.argv[1:4]
    result = run_logits(which, int(arg)) if kind == "logits" else run_mask(which, arg)
    print(json.dumps(result), flush=True)
