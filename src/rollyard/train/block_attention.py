"""Block-sparse tree attention for CPU: only the keys a query block can see are ever touched.

A dense tree mask makes every query attend over all L packed keys, so a GRPO group (one prompt,
many completions) costs as much attention as not merging at all. Here the queries are split
into blocks; a block's keys are the union of its tokens' ancestors, i.e. the columns ``j < qb``
with ``subtree_end[j] > qa``. Each block runs one fused SDPA call on those gathered keys with
its slice of the ancestor mask, so cost and memory scale with the tree's real attention pairs.

Registered with transformers' ``AttentionInterface`` as ``rollyard_tree``; the per-micro-batch
plan travels to every layer through the model's forward kwargs (``tree_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rollyard.train.packing import MicroBatch

IMPL_NAME = "rollyard_tree"


@dataclass(frozen=True)
class TreePlan:
    """For each query block: its range, the key columns it may see, and the mask over them."""

    blocks: list[tuple[int, int, slice | torch.Tensor, torch.Tensor]]  # (qa, qb, keys, bool mask)

    @property
    def pairs(self) -> int:
        return sum(int(m.numel()) for _, _, _, m in self.blocks)


def make_plan(mb: MicroBatch, device: torch.device, block: int = 256) -> TreePlan:
    """The block-sparse plan of a micro-batch; ``block`` query tokens per SDPA call."""
    end = mb.subtree_end
    blocks = []
    for qa in range(0, mb.num_tokens, block):
        qb = min(qa + block, mb.num_tokens)
        cols = np.flatnonzero(end[:qb] > qa)
        rows = np.arange(qa, qb)
        allowed = (cols[None, :] <= rows[:, None]) & (rows[:, None] < end[cols][None, :])
        contiguous = cols.shape[0] == int(cols[-1]) - int(cols[0]) + 1
        keys = slice(int(cols[0]), int(cols[-1]) + 1) if contiguous else torch.from_numpy(cols).to(device)
        blocks.append((qa, qb, keys, torch.from_numpy(allowed).to(device)[None, None]))
    return TreePlan(blocks=blocks)


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tree_plan: TreePlan | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention hook: (B, H, L, D) q/k/v in, (B, L, H, D) out."""
    if tree_plan is None:  # a plain chain (or an explicit mask): the stock SDPA path
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for qa, qb, keys, allowed in tree_plan.blocks:
        if isinstance(keys, slice):  # a contiguous key range (e.g. a prompt): a view, no copy
            k, v = key[:, :, keys], value[:, :, keys]
        else:
            k, v = key.index_select(2, keys), value.index_select(2, keys)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, qa:qb],
                k,
                v,
                attn_mask=allowed,
                dropout_p=dropout if module.training else 0.0,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    out = torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``rollyard_tree`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL_NAME, tree_attention_forward)
