"""Trainer: prefix-tree packing, tree attention, the training loop, checkpoints and weight files."""

from rollyard.train.attention import (
    ATTENTION_IMPLS,
    choose_attention,
    forward_logits,
    set_attention,
    tree_mask,
)
from rollyard.train.checkpoint import load_checkpoint, save_weights
from rollyard.train.distributed import DataParallel
from rollyard.train.logprobs import sample_logprobs
from rollyard.train.models import build_model, model_config_for, model_sizes
from rollyard.train.objective import BatchTotals, LossConfig
from rollyard.train.packing import MicroBatch, PackedBatch, pack_samples
from rollyard.train.step import StepResult, forward_backward
from rollyard.train.trainer import TrainConfig, Trainer

__all__ = [
    "ATTENTION_IMPLS",
    "BatchTotals",
    "DataParallel",
    "LossConfig",
    "MicroBatch",
    "PackedBatch",
    "StepResult",
    "TrainConfig",
    "Trainer",
    "build_model",
    "choose_attention",
    "forward_backward",
    "forward_logits",
    "load_checkpoint",
    "model_config_for",
    "model_sizes",
    "pack_samples",
    "sample_logprobs",
    "save_weights",
    "set_attention",
    "tree_mask",
]
