"""One forward+backward over a packed batch: the shared inner loop of RL training, SFT and the benchmark.

Gradients accumulate over micro-batches (the token budget); each micro-batch's loss carries its
share of the batch, so the accumulated gradient is that of the whole batch's loss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollyard.core.errors import TrainError
from rollyard.core.sample import Sample
from rollyard.train.attention import attention_inputs
from rollyard.train.logprobs import micro_batch_logprobs
from rollyard.train.objective import BatchTotals, CorrectionConfig, LossConfig, micro_batch_loss
from rollyard.train.packing import PackedBatch


@dataclass
class StepResult:
    loss: float = 0.0  # this process's share of the batch loss
    finite: bool = True
    metrics: dict[str, float] = field(default_factory=dict)  # token-weighted means over micro-batches
    logprobs: dict[int, torch.Tensor] = field(default_factory=dict)  # detached, when kept
    # Wall seconds per phase, summed over micro-batches: where a step's time goes (bench tree).
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))


PHASES = ("mask", "forward", "loss", "backward")


def forward_backward(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    packed: PackedBatch,
    loss_config: LossConfig,
    impl: str,
    *,
    totals: BatchTotals | None = None,
    backward: bool = True,
    keep_logprobs: bool = False,
    temperature: float = 1.0,
    correction: CorrectionConfig | None = None,
    decoupled: bool = False,
    logits_chunk: int = 0,
) -> StepResult:
    """Run every micro-batch; ``totals`` defaults to this batch's (pass the global one under DP).

    ``temperature``: the sampling temperature of the behaviour tokens; logits are divided by it,
    so the trained distribution is the one that was sampled (and matches recorded logprobs).
    ``correction``, ``decoupled``: the off-policy correction (``objective.micro_batch_loss``).
    ``logits_chunk``: apply the LM head this many rows at a time, never holding the (L, V) logits
    (``train.logprobs``); 0 takes the full-logits path."""
    totals = totals or BatchTotals.of(samples)
    result = StepResult()
    weighted: dict[str, float] = {}
    weight_sum = 0.0
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    clock = time.perf_counter
    for mb in packed.micro_batches:
        t0 = clock()
        inputs = attention_inputs(mb, impl, device, dtype)
        t1 = clock()
        lps, ents = micro_batch_logprobs(model, mb, impl, inputs, temperature=temperature, chunk=logits_chunk)
        t2 = clock()
        mb_samples = [samples[i] for i in mb.samples]
        nan = lps[0].new_full((), float("nan"))
        if not all(bool(torch.isfinite(lp).all()) for lp in lps):  # the model, not the data, diverged
            loss, metrics = nan, {}
        else:
            try:
                loss, metrics = micro_batch_loss(loss_config, lps, mb_samples, totals, correction, decoupled)
            except TrainError:  # the rl losses refuse a non-finite loss; the step gets skipped
                loss, metrics = nan, {}
        t3 = clock()
        if not torch.isfinite(loss):
            result.finite = False
        if backward:  # a non-finite step still runs its backward: sharded ranks run as many (trainer.py)
            (loss if result.finite else torch.cat(lps).sum() * 0.0).backward()
        t4 = clock()
        for k, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            result.phases[k] += dt
        result.loss += float(loss.detach())
        tokens = float(sum(s.num_loss_tokens for s in mb_samples))
        ent_sum = sum(
            float(e[torch.tensor(s.loss_mask, dtype=torch.bool, device=e.device)].sum())
            for s, e in zip(mb_samples, ents, strict=True)
        )
        metrics["entropy"] = ent_sum / max(tokens, 1.0)
        for k, v in metrics.items():
            weighted[k] = weighted.get(k, 0.0) + v * tokens
        weight_sum += tokens
        if keep_logprobs:
            for i, lp in zip(mb.samples, lps, strict=True):
                result.logprobs[i] = lp.detach()
        del lps, loss
    result.metrics = {k: v / max(weight_sum, 1.0) for k, v in weighted.items() if k not in ("loss", "tokens")}
    return result
