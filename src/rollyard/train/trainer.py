"""The training loop's one step: pack, forward, loss, backward, all-reduce, clip, AdamW, metrics.

RL and SFT share this code path; only ``LossConfig.kind`` differs. A step whose loss or gradient
is not finite changes no weight: it is skipped and counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import ConfigError, DataError
from rollyard.core.heap import release_free_heap
from rollyard.core.sample import Sample
from rollyard.train.attention import choose_attention, set_attention
from rollyard.train.checkpoint import commit_checkpoint, load_checkpoint, stage_dir, write_shards
from rollyard.train.distributed import DataParallel
from rollyard.train.objective import BatchTotals, CorrectionConfig, LossConfig
from rollyard.train.packing import pack_samples
from rollyard.train.sharding import (
    Dtype,
    ParallelConfig,
    check_dtype,
    decoder_layers,
    full_weights,
    is_sharded,
    rank_device,
    shard_model,
    weights_view,
)
from rollyard.train.step import StepResult, forward_backward

# Reported per step with the ipa loss: train/inference mismatch per chunk, and how much was masked.
IPA_METRICS = ("chunk_mask_frac", "mismatch_mean", "mismatch_p90", "mismatch_max")
# Reported per step with every policy loss: quantiles of rho = pi_prox/mu over trained tokens
# (token-weighted means of the micro-batches' quantiles) and the shares the correction acted on.
CORRECTION_METRICS = (
    "is_ratio_p10",
    "is_ratio_p50",
    "is_ratio_p90",
    "is_masked_frac",
    "is_truncated_frac",
    "behaviour_kl",  # KL(mu || pi_prox), k3 estimate: how far the sampler was from the trainer
    "forced_frac",  # trained tokens a grammar forced: no ratio taken against their logprobs
)

logger = logging.getLogger(__name__)


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float = Field(default=1.0, gt=0)
    token_budget: int = Field(default=8192, ge=1)  # tokens per micro-batch (gradient accumulation)
    max_tree_tokens: int = Field(default=8192, ge=2)  # larger trees are cut, shared prefixes recomputed
    merge: bool = True  # prefix-tree merging; False trains every sample on its own
    attention: str = "auto"
    loss: LossConfig = Field(default_factory=LossConfig)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)  # off-policy correction
    decoupled: bool = False  # ratio against the proximal policy, behaviour corrected by pi_prox/mu
    temperature: float = Field(default=1.0, gt=0)  # the rollouts' sampling temperature
    # LM-head rows per chunk in the loss (train.logprobs): the (L, V) logits are never held; 0 = off.
    logits_chunk: int = Field(default=512, ge=0)
    # Train only the top N decoder layers and the final norm (embeddings, tied head and the layers
    # below frozen): no backward below them, ~2x cheaper steps for a pretrained model on a CPU.
    train_layers: int | None = Field(default=None, ge=1)
    # fp32 everywhere, or bf16 compute over fp32 master weights (CUDA only; train/sharding.py)
    dtype: Dtype = "fp32"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)  # FSDP2 sharding or replicas
    # Recompute each decoder layer's activations in the backward instead of keeping them.
    activation_checkpointing: bool = False

    @model_validator(mode="after")
    def _correction_fits(self) -> TrainConfig:
        try:
            self.correction.check(self.decoupled)
        except ConfigError as e:
            raise ValueError(str(e)) from e
        return self


def freeze_below(model: torch.nn.Module, n: int) -> None:
    """Leave only the top ``n`` decoder layers and the final norm trainable (a transformers
    decoder-only LM: ``model.model.layers`` and ``model.model.norm``)."""
    layers = decoder_layers(model)
    inner = model.model
    if not hasattr(inner, "norm"):
        raise ConfigError(f"train_layers needs a decoder LM with .model.norm, not {type(model).__name__}")
    if n > len(layers):
        raise ConfigError(f"train_layers={n}, but the model has {len(layers)} layers")
    model.requires_grad_(False)
    for module in (*layers[len(layers) - n :], inner.norm):
        module.requires_grad_(True)


class Trainer:
    """Owns the model's optimizer and step counters; ``train_step`` takes this rank's samples."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainConfig,
        *,
        clock: Clock | None = None,
        parallel: DataParallel | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.clock = clock or SystemClock()
        self.parallel = parallel or DataParallel.from_env()
        self.device = rank_device()
        check_dtype(config.dtype, self.device)
        if config.dtype == "bf16" and not self.parallel.group:
            raise ConfigError(
                "trainer.dtype: bf16 runs through FSDP2 mixed precision: it needs a process group"
            )
        # what a published copy of the weights is built as (FSDP2 renames the wrapped class)
        gen = getattr(model, "generation_config", None)
        self._plain = (type(model), model.config, gen)  # type: ignore[union-attr]
        model.to(self.device)
        self.impl = choose_attention(self.device, config.attention)
        set_attention(model, self.impl)
        if config.train_layers is not None:
            freeze_below(model, config.train_layers)
        if config.activation_checkpointing:  # non-reentrant: the tree_plan kwarg reaches attention
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
        if self.parallel.group:
            shard_model(model, config.parallel.kind, config.dtype, self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.trainable = sum(p.numel() for p in self.params)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )
        self.step = 0  # applied optimizer steps
        self.skipped = 0  # steps skipped for a non-finite loss or gradient

    def check(self, samples: Sequence[Sample]) -> None:
        """Refuse token ids the model has no embedding for (before any rank starts the step)."""
        vocab = int(getattr(self.model.config, "vocab_size", 0))  # type: ignore[union-attr]
        for i, s in enumerate(samples):
            if vocab and max(s.token_ids) >= vocab:
                raise DataError(f"sample {i} has token id {max(s.token_ids)} >= vocab size {vocab}")

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step on this rank's share of the global batch; returns global metrics."""
        self.check(samples)
        live = [s for s in samples if s.num_loss_tokens > 0]
        local = BatchTotals.of(live)
        tokens, n_live, n_empty = self.parallel.sum_floats(
            [float(local.tokens), float(local.live_samples), float(len(samples) - len(live))]
        )
        if tokens == 0:
            raise DataError("the batch has no trained token (every loss mask is empty)")
        totals = BatchTotals(tokens=int(tokens), live_samples=int(n_live))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        t0 = self.clock.now()
        res, forwarded, unmerged = StepResult(), 0, 0
        packed = (
            pack_samples(
                live,
                token_budget=self.config.token_budget,
                max_tree_tokens=self.config.max_tree_tokens,
                max_context=getattr(self.model.config, "max_position_embeddings", None),  # type: ignore[union-attr]
                merge=self.config.merge,
            )
            if live
            else None
        )
        passes = len(packed.micro_batches) if packed else 0
        # agreed before any forward: FSDP2's all-gathers start with the first one
        idle = self.parallel.max_int(passes) - passes if self.parallel.group else 0
        if packed:
            res = forward_backward(
                self.model,
                live,
                packed,
                self.config.loss,
                self.impl,
                totals=totals,
                temperature=self.config.temperature,
                correction=self.config.correction,
                decoupled=self.config.decoupled,
                logits_chunk=self.config.logits_chunk,
            )
            forwarded, unmerged = packed.forwarded_tokens, packed.unmerged_tokens
        for _ in range(idle):
            self._idle_pass()
        weight = float(local.tokens)
        keys = ("entropy", "clip_frac", "approx_kl", "kl_ref")
        if self.config.loss.kind == "ipa":
            keys += IPA_METRICS
        if self.config.loss.kind != "sft":
            keys += CORRECTION_METRICS
        sums = self.parallel.sum_floats(
            [res.loss, 0.0 if res.finite else 1.0, float(forwarded), float(unmerged), float(idle)]
            + [res.metrics.get(k, 0.0) * weight for k in keys]
        )
        loss, nonfinite, forwarded_all, unmerged_all, idle_all = sums[:5]
        grad_norm = float(_full(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)))
        skipped = nonfinite > 0 or not math.isfinite(loss) or not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            logger.warning("step skipped: non-finite loss=%s grad_norm=%s", loss, grad_norm)
        else:
            self.optimizer.step()
            self.step += 1
        # what this step freed goes back to the system: glibc would keep it, and a long run's
        # resident memory grew to ~3x one step's peak (core/heap.py)
        release_free_heap()
        seconds = max(self.clock.now() - t0, 1e-9)
        metrics = {
            "step": float(self.step),
            "loss": loss,
            "grad_norm": grad_norm,
            "skipped": float(skipped),
            "skipped_total": float(self.skipped),
            "trained_tokens": tokens,
            "empty_samples": n_empty,
            "tokens_per_s": forwarded_all / seconds,
            "merged_unmerged_ratio": forwarded_all / max(unmerged_all, 1.0),
            "seconds": seconds,
            "trainable_params": float(self.trainable),
        }
        if self.parallel.group:
            metrics["idle_passes"] = idle_all  # zero-gradient passes that kept ranks in step
        metrics.update({k: v / tokens for k, v in zip(keys, sums[5:], strict=True)})
        metrics["kl"] = metrics.pop("approx_kl")
        if "mismatch_max" in metrics:  # a weighted mean of maxima is not a maximum; say what it is
            metrics["mismatch_max_mean"] = metrics.pop("mismatch_max")
        return metrics

    def _idle_pass(self) -> None:
        """A forward and backward whose loss is 0 x the logits: no gradient, same collectives.

        Under FSDP2 every forward all-gathers each layer's weights and every backward
        reduce-scatters its gradients, so all ranks must run as many passes, or the rank with
        more micro-batches waits forever for the others. Tree packing gives ranks different
        numbers of micro-batches (or none: a shard with no trained token), so ranks with fewer
        pad with these two-token passes, which add exactly zero to the summed gradients."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=False)
        (out.logits.float().sum() * 0.0).backward()

    def weights(self) -> Any:
        """The model to publish: this module, or under FSDP2 a plain CPU model of the gathered
        full weights on rank 0 (``None`` on other ranks). Collective when sharded."""
        if not is_sharded(self.model):
            return self.model
        full = full_weights(self.model)
        return weights_view(*self._plain, full) if full else None

    def write_shards(self, staged: Path) -> None:
        """This rank's part of a checkpoint, into the staged directory. Collective."""
        write_shards(staged, self.model, self.optimizer)

    def commit(self, staged: Path, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """Add counters, RNG and ``extra_state`` to a staged checkpoint and rename it into place."""
        meta = {"step": self.step, "skipped": self.skipped, "config": self.config.model_dump(mode="json")}
        return commit_checkpoint(staged, Path(path), meta, extra_state)

    def save(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """Atomic checkpoint of everything a resumed run needs, plus the caller's ``extra_state``."""
        staged = stage_dir(Path(path))
        self.write_shards(staged)
        return self.commit(staged, path, extra_state)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Resume from ``path`` (saved at any world size); returns its ``extra_state``. Collective."""
        meta, extra = load_checkpoint(path, self.model, self.optimizer)
        self.step, self.skipped = int(meta["step"]), int(meta["skipped"])
        return extra


def _full(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm over sharded parameters is a partial DTensor: reduce it over ranks."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm
