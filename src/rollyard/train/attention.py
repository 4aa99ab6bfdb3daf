"""Tree attention: run a transformers causal LM on a packed micro-batch with a 4D ancestor mask.

transformers (5.x) passes a 4D ``attention_mask`` through untouched, so the mask says exactly
which packed tokens a token sees: its ancestors and itself. Formats per implementation:

- ``rollyard_tree`` (CPU default): block-sparse SDPA over each query block's ancestor keys
  (``block_attention``); attention cost follows the tree's real attention pairs.
- ``sdpa``: dense bool mask (True = attend) into torch SDPA; on CPU the fused kernel keeps only
  the mask, not an (L, L) score matrix per head, so memory is O(L^2) bytes for the mask.
- ``eager``: dense additive float mask (a cross-check; materialises scores).
- ``flex_attention``: a FlexAttention ``BlockMask`` built from the DFS ranges block by block
  (``flex_mask``; no per-pair evaluation). torch 2.13 has no FlexAttention backward on CPU, so
  ``auto`` picks it on CUDA only.

A chain (one unbranched sample) gets no mask at all: plain causal attention, the baseline.
The memory rule for long trees lives in packing (``max_tree_tokens``, ``token_budget``): samples are
cut into parts of at most that many tokens (shared prefixes recomputed per part), so a row's mask is
bounded by ``token_budget^2`` bytes unless one sample alone is longer.
"""

from __future__ import annotations

from typing import Any

import torch

from rollyard.core.errors import ConfigError
from rollyard.train.block_attention import IMPL_NAME as TREE_IMPL
from rollyard.train.block_attention import make_plan, register
from rollyard.train.flex_mask import tree_block_mask
from rollyard.train.packing import MicroBatch

ATTENTION_IMPLS = ("auto", TREE_IMPL, "sdpa", "eager", "flex_attention")


def choose_attention(device: torch.device | str, requested: str = "auto") -> str:
    """The attention implementation to use on ``device``; an explicit choice wins."""
    if requested not in ATTENTION_IMPLS:
        raise ConfigError(f"unknown attention {requested!r}; choose one of {', '.join(ATTENTION_IMPLS)}")
    if requested != "auto":
        return requested
    return "flex_attention" if torch.device(device).type == "cuda" else TREE_IMPL


def tree_mask(mb: MicroBatch, impl: str, device: torch.device, dtype: torch.dtype) -> Any:
    """The 4D mask (1, 1, L, L) for ``impl``, or ``None`` when the micro-batch is one causal chain."""
    if mb.is_chain:
        return None
    if impl == "flex_attention":
        return tree_block_mask(mb, device)
    allowed = torch.from_numpy(mb.ancestor_mask()).to(device)[None, None]
    if impl == "sdpa":
        return allowed
    if impl == "eager":
        neg = torch.finfo(dtype).min
        return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, neg)
    raise ConfigError(f"no tree mask for attention {impl!r}")


def set_attention(model: torch.nn.Module, impl: str) -> None:
    """Switch a transformers model's attention implementation in place (no reload)."""
    if impl == TREE_IMPL:
        register()
    config = model.config  # type: ignore[attr-defined]
    if getattr(config, "_attn_implementation", None) != impl:
        setter = getattr(model, "set_attn_implementation", None)
        if callable(setter):
            setter(impl)
        else:
            config._attn_implementation = impl


def attention_inputs(mb: MicroBatch, impl: str, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The model kwargs that carry ``mb``'s tree structure to ``impl`` (a mask, or a block plan)."""
    if impl == TREE_IMPL:
        return (
            {"attention_mask": None}
            if mb.is_chain
            else {"attention_mask": None, "tree_plan": make_plan(mb, device)}
        )
    return {"attention_mask": tree_mask(mb, impl, device, dtype)}


def forward_logits(
    model: torch.nn.Module, mb: MicroBatch, impl: str, inputs: dict[str, Any] | None = None, **kwargs: Any
) -> torch.Tensor:
    """(L, V) logits of every packed token; ``impl`` must already be set on the model.

    ``inputs``: ``attention_inputs`` built beforehand (so a caller can time them apart);
    ``kwargs`` go to the model (``logits_to_keep``)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids = torch.from_numpy(mb.input_ids).to(device)[None]
    pos = torch.from_numpy(mb.position_ids).to(device)[None]
    extra = inputs if inputs is not None else attention_inputs(mb, impl, device, dtype)
    out = model(input_ids=ids, position_ids=pos, use_cache=False, **extra, **kwargs)
    return out.logits[0]
