"""Per-token logprobs of a packed micro-batch, with or without ever holding its (L, V) logits.

The full path (``logits_chunk=0``) runs the model to its (L, V) logits, then takes logsumexp and
entropy over them: with a 49k-152k vocabulary that tensor, its softmax and their gradients dominate
a step's memory (~5 x L x V x 4 bytes measured). The chunked path stops at the final hidden states
and applies the LM head ``chunk`` rows at a time inside a custom autograd function that keeps only
the (rows,) logsumexp and recomputes each chunk's logits in backward (the fused linear
cross-entropy idea of Liger and verl). Only the rows that predict a trained token are evaluated,
each once, so a prompt node shared by a whole group is one row.

The chunked path runs inside the model's own ``forward`` (a hook on its base model), so an FSDP2
root's parameters, the tied embedding included, are gathered while the head is applied, and their
gradients flow back through the same autograd graph as the full path's.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import numpy as np
import torch

from rollyard.train.attention import forward_logits
from rollyard.train.packing import MicroBatch

logger = logging.getLogger(__name__)

# Config attributes of heads that do more than ``hidden @ W.T`` (Gemma-2 soft-capping, Cohere and
# Granite scales): the chunked head would silently change their logits, so they take the full path.
_HEAD_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class _ChunkedLogSumExp(torch.autograd.Function):
    """``logsumexp(hidden @ W.T / T)`` per row and the entropy (no grad), ``chunk`` rows at a time."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, temperature: float, chunk: int, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        lse = hidden.new_empty(rows, dtype=torch.float32)
        ent = hidden.new_zeros(rows, dtype=torch.float32)
        for a in range(0, rows, chunk):
            z = torch.nn.functional.linear(hidden[a : a + chunk], weight).float()
            if temperature != 1.0:
                z.div_(temperature)
            lse[a : a + chunk] = torch.logsumexp(z, dim=-1)
            if entropy:  # H = lse - sum(p * z), with p = exp(z - lse)
                p = (z - lse[a : a + chunk, None]).exp_()
                ent[a : a + chunk] = lse[a : a + chunk] - p.mul_(z).sum(-1)
        ctx.save_for_backward(hidden, weight, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent)
        return lse, ent

    @staticmethod
    def backward(ctx: Any, g_lse: torch.Tensor, _g_ent: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(hidden) if want_h else None
        dw = torch.zeros_like(weight) if want_w else None
        for a in range(0, hidden.shape[0], chunk):
            h = hidden[a : a + chunk]
            z = torch.nn.functional.linear(h, weight).float()
            if t != 1.0:
                z.div_(t)
            # d lse / d z = softmax(z); d z / d (h W^T) = 1 / T
            g = z.sub_(lse[a : a + chunk, None]).exp_().mul_((g_lse[a : a + chunk] / t)[:, None])
            g = g.to(weight.dtype)
            if dh is not None:
                torch.mm(g, weight, out=dh[a : a + chunk])
            if dw is not None:
                dw.addmm_(g.t(), h)
        return dh, dw, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``sample_logprobs`` from the (L, H) final hidden states and the (V, H) head weight."""
    pred, tgt_nodes = _prediction_pairs(mb)
    # A target node is predicted by one node (its parent), so unique target nodes are the unique
    # (row, token) pairs, and each predicting row is evaluated once however many samples share it.
    nodes, first, pair_of = np.unique(tgt_nodes, return_index=True, return_inverse=True)
    rows, row_of = np.unique(pred[first], return_inverse=True)
    dev = hidden.device
    h_rows = hidden.index_select(0, torch.from_numpy(rows).to(dev))
    lse, ent = _ChunkedLogSumExp.apply(h_rows, weight, float(temperature), int(chunk), with_entropy)
    row_t = torch.from_numpy(row_of).to(dev)
    tok = torch.from_numpy(mb.input_ids[nodes]).to(dev)
    target = (h_rows.index_select(0, row_t) * weight.index_select(0, tok)).sum(-1).float() / temperature
    pair_t = torch.from_numpy(pair_of).to(dev)
    flat = (target - lse.index_select(0, row_t)).index_select(0, pair_t)
    ent_flat = ent.index_select(0, row_t).index_select(0, pair_t)
    return _per_sample(flat, ent_flat, mb)


def sample_logprobs(
    logits: torch.Tensor, mb: MicroBatch, *, with_entropy: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sample of ``mb``: logprob of each token (0 at t=0) and the entropy of its predictive
    distribution (no grad, 0 at t=0), from the full (L, V) logits."""
    pred, tgt_nodes = _prediction_pairs(mb)
    pred_t = torch.from_numpy(pred).to(logits.device)
    tgt = torch.from_numpy(mb.input_ids[tgt_nodes]).to(logits.device)
    lse = torch.logsumexp(logits, dim=-1)
    flat = logits[pred_t, tgt] - lse[pred_t]
    ent_flat = torch.zeros_like(flat)
    if with_entropy:
        with torch.no_grad():
            logp = torch.log_softmax(logits.detach(), dim=-1)
            node_ent = -(logp.exp() * logp).sum(-1)
            ent_flat = node_ent[pred_t]
    return _per_sample(flat, ent_flat, mb)


def _prediction_pairs(mb: MicroBatch) -> tuple[np.ndarray, np.ndarray]:
    """Packed node of every predicting token (t-1) and of its target token (t), samples concatenated."""
    pred = np.concatenate([ix[:-1] for ix in mb.token_index])
    tgt = np.concatenate([ix[1:] for ix in mb.token_index])
    return pred, tgt


def _per_sample(
    flat: torch.Tensor, ent_flat: torch.Tensor, mb: MicroBatch
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    sizes = [int(ix.shape[0]) - 1 for ix in mb.token_index]
    zero = flat.new_zeros(1)
    lps = [torch.cat([zero, c]) for c in torch.split(flat, sizes)]
    ents = [torch.cat([zero.to(ent_flat.dtype), c]) for c in torch.split(ent_flat, sizes)]
    return lps, ents


def chunk_blocker(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot take the chunked head (``None`` when it can): it must be a transformers
    causal LM with a base ``.model``, a bias-free linear ``.lm_head`` and ``logits_to_keep``."""
    head = getattr(model, "lm_head", None)
    if not isinstance(getattr(model, "model", None), torch.nn.Module):
        return "no base model at .model"
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return "its .lm_head is not a bias-free nn.Linear"
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return "its forward takes no logits_to_keep"
    config = getattr(model, "config", None)
    extras = [k for k in _HEAD_EXTRAS if getattr(config, k, None) not in (None, 1.0)]
    if extras:
        return f"its head also applies {', '.join(extras)}"
    return None


@functools.cache
def _warn_full(kind: str, why: str) -> None:
    logger.warning("trainer.logits_chunk is set but %s %s: full (L, V) logits are used", kind, why)


def micro_batch_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    impl: str,
    inputs: dict[str, Any],
    *,
    temperature: float = 1.0,
    chunk: int = 0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-sample logprobs and entropies of ``mb``: chunked when ``chunk`` > 0 and the model allows."""
    why = chunk_blocker(model) if chunk > 0 else "logits_chunk=0"
    if why is not None:
        if chunk > 0:
            _warn_full(type(model).__name__, why)
        logits = forward_logits(model, mb, impl, inputs)
        if temperature != 1.0:
            logits = logits / temperature
        return sample_logprobs(logits, mb)
    out: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def head(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        weight = model.lm_head.weight  # type: ignore[union-attr]
        out.append(chunked_logprobs(hidden[0], weight, mb, temperature=temperature, chunk=chunk))

    none = torch.zeros(0, dtype=torch.long, device=next(model.parameters()).device)
    handle = model.model.register_forward_hook(head)  # type: ignore[union-attr]
    try:  # the model's own head then sees no row at all: (1, 0, V) logits
        forward_logits(model, mb, impl, inputs, logits_to_keep=none)
    finally:
        handle.remove()
    return out[0]
