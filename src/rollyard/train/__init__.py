"""Trainer: prefix-tree packing, tree attention, the training loop, checkpoints and weight files."""

from rollyard.train.attention import (
    ATTENTION_IMPLS,
    choose_attention,
    forward_logits,
    sample_logprobs,
    set_attention,
    tree_mask,
)
from rollyard.train.models import build_model, model_config_for, model_sizes
from rollyard.train.packing import MicroBatch, PackedBatch, pack_samples

__all__ = [
    "ATTENTION_IMPLS",
    "MicroBatch",
    "PackedBatch",
    "build_model",
    "choose_attention",
    "forward_logits",
    "model_config_for",
    "model_sizes",
    "pack_samples",
    "sample_logprobs",
    "set_attention",
    "tree_mask",
]
