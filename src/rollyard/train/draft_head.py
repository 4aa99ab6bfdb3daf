"""An EAGLE draft head for a Llama policy, trained with a Top-K KL loss against the policy.

The head is what vLLM 0.32's ``eagle`` method serves for Llama targets
(``vllm/model_executor/models/llama_eagle.py``): at position i it reads the target's final
(post-norm) hidden state ``h_i`` and the embedding of the next token ``x_{i+1}``, mixes them
with ``fc`` (2H -> H), runs one Llama decoder layer without its input norm and scores the
result with the target's own ``lm_head``; the embeddings and ``lm_head`` are the target's
(vLLM shares them when the checkpoint has none), so the head follows every policy update of
those for free and the checkpoint is 16.8 MB for SmolLM2-135M (``fc`` and one layer).

Training matches that forward exactly: the policy's hidden states and logits come from a
no-grad forward pass, the loss is the KL from the policy's renormalised top-K next-token
distribution at i+1 to the head's, plus EAGLE's feature regression towards ``h_{i+1}`` (what
the head's output is fed back as when it drafts its second and later tokens). Gradients reach
only the head.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rollyard.core.errors import ConfigError
from rollyard.engines.drafting.eagle_files import HEAD_FILE, HEAD_META

# the warm-up's AdamW state beside an auto head, for the online head to continue: a fresh AdamW's
# first step moves every weight by ``lr`` (m / sqrt(v) is the gradient's sign), ~2.1 in L2 for
# SmolLM2-135M's 4.4 M head weights, and that step blew the warm head up (Top-K KL 1.08 -> 40.2).
# Not ``*.pt``/``*.bin``: vLLM's loader would take those for weights.
HEAD_OPTIM = "rollyard_adamw.pth"


def head_config(target_config: Any) -> Any:
    """The head's ``config.json``: the target's Llama config cut to one layer."""
    from transformers import LlamaConfig

    if getattr(target_config, "model_type", None) != "llama":
        raise ConfigError(
            f"an eagle draft head needs a Llama-family policy, not {target_config.model_type!r}"
        )
    d = target_config.to_dict()
    d.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        d.pop(key, None)
    return LlamaConfig(**d)


class EagleHead(nn.Module):
    """``fc`` over [embed(x_{i+1}); h_i], then one decoder layer with no input norm."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config._attn_implementation = "sdpa"
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        # no input norm, as vLLM's eagle layer 0 (and EAGLE's)
        setattr(self.layer, "input_layernorm", nn.Identity())  # noqa: B010
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``embeds`` [B, T, H] of tokens 1..T, ``hidden`` [B, T, H] at 0..T-1: the head's
        features at 0..T-1 (causal; right padding does not reach real positions)."""
        x = self.fc(torch.cat((embeds, hidden), dim=-1))
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0).expand(x.shape[0], -1)
        return self.layer(x, position_ids=pos, position_embeddings=self.rotary(x, pos))

    @classmethod
    def from_policy(cls, policy: nn.Module) -> EagleHead:
        """A head that starts as the identity on h_i: ``fc`` passes h_i through and the layer
        (a copy of the policy's last, so its norms and projections speak the policy's feature
        space) has its attention and MLP outputs zeroed, so it first drafts what the policy
        would say at i. Measured on the SFT'd SmolLM2 (3 agent turns, 8 steps): Top-K KL 16 ->
        5.1 and top-1 0.02 -> 0.52, against 552 -> 147 and 0.00 -> 0.15 from the plain copy."""
        head = cls(head_config(policy.config))
        last = policy.model.layers[-1].state_dict()
        head.layer.load_state_dict({k: v for k, v in last.items() if "input_layernorm" not in k})
        h = head.config.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, h:] = torch.eye(h)
            head.layer.self_attn.o_proj.weight.zero_()
            head.layer.mlp.down_proj.weight.zero_()
        p = next(policy.parameters())
        return head.to(device=p.device, dtype=p.dtype)

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the names vLLM's ``EagleLlamaForCausalLM.load_weights`` expects."""
        out = {"fc.weight": self.fc.weight}
        for k, v in self.layer.state_dict().items():
            out[f"layers.0.{k}"] = v
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in out.items()}

    def load_vllm_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.fc.weight.data.copy_(sd["fc.weight"])
        prefix = "layers.0."
        self.layer.load_state_dict({k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)})


def save_head(
    head: EagleHead,
    out_dir: str | Path,
    meta: dict[str, Any] | None = None,
    optim: dict[str, Any] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ our meta, + ``optim``: the AdamW state
    that trained it, ``HEAD_OPTIM``) into ``out_dir`` atomically (a sibling temp dir renamed
    over it), so an engine never reads half a head."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        head.config.to_json_file(str(tmp / "config.json"))
        save_file(head.vllm_state_dict(), str(tmp / HEAD_FILE))
        (tmp / HEAD_META).write_text(json.dumps(meta or {}))
        if optim is not None:
            torch.save(optim, tmp / HEAD_OPTIM)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_head(head_dir: str | Path, policy: nn.Module) -> EagleHead:
    from safetensors.torch import load_file

    d = Path(head_dir)
    if not (d / HEAD_FILE).is_file():
        raise ConfigError(f"engine.drafting.head: {d} has no {HEAD_FILE} (make one with head: auto)")
    head = EagleHead(head_config(policy.config))
    try:
        head.load_vllm_state_dict(load_file(str(d / HEAD_FILE)))
    except (KeyError, RuntimeError) as e:
        raise ConfigError(f"engine.drafting.head: {d} does not fit the policy: {e}") from e
    p = next(policy.parameters())
    return head.to(device=p.device, dtype=p.dtype)  # beside the policy (its CUDA device, if any)


@dataclass
class Targets:
    """What the head learns from one token row, from one no-grad policy forward: the row, the
    policy's final hidden states and its top-K next-token logits (values and ids)."""

    ids: torch.Tensor  # [T]
    hidden: torch.Tensor  # [T, H]
    top: torch.Tensor  # [T, K]
    top_ids: torch.Tensor  # [T, K]


@torch.no_grad()
def policy_targets(policy: nn.Module, rows: list[list[int]], topk: int, max_len: int = 1024) -> list[Targets]:
    """One no-grad forward per row (cut to its last ``max_len`` tokens); rows under 2 tokens skip."""
    out = []
    device = next(policy.parameters()).device
    for r in rows:
        if len(r) < 2:
            continue
        ids = torch.tensor(r[-max_len:], dtype=torch.long, device=device)
        hidden = policy.model(input_ids=ids[None]).last_hidden_state[0]  # post-norm, as vLLM passes
        top, top_ids = policy.lm_head(hidden).topk(topk, dim=-1)
        out.append(Targets(ids, hidden, top, top_ids))
    return out


def head_loss(
    head: EagleHead, policy: nn.Module, t: Targets, reg_weight: float = 1.0
) -> dict[str, torch.Tensor]:
    """The head's loss on one row: at position i it reads h_i and x_{i+1} and should give the
    policy's top-K distribution at i+1 (KL) and its features h_{i+1} (regression)."""
    embeds = policy.model.embed_tokens(t.ids[1:]).detach()
    out = head(embeds[None], t.hidden[None, :-1])[0]
    logq = F.log_softmax(F.linear(out, policy.lm_head.weight.detach()), dim=-1)
    logp = F.log_softmax(t.top[1:], dim=-1)
    kl = (logp.exp() * (logp - logq.gather(-1, t.top_ids[1:]))).sum(-1).mean()
    reg = F.smooth_l1_loss(out, t.hidden[1:])
    top1 = (logq.argmax(-1) == t.top_ids[1:, 0]).float().mean()
    return {"loss": kl + reg_weight * reg, "kl": kl.detach(), "reg": reg.detach(), "top1": top1}


class HeadTrainer:
    """The head with its own AdamW: ``step(targets)`` is one Top-K KL step on rows' targets (the
    warm start's demonstrations, or an RL step's trajectories), token-weighted."""

    def __init__(self, head: EagleHead, policy: nn.Module, *, topk: int = 64, lr: float = 1e-3) -> None:
        self.head, self.policy, self.topk = head, policy, topk
        self.opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
        self.steps = 0
        self.skipped = 0  # steps whose loss or gradient was not finite (not applied)

    def step(self, targets: list[Targets]) -> dict[str, float]:
        if not targets:
            raise ValueError("draft head step: no row has two tokens")
        self.head.train()
        self.opt.zero_grad(set_to_none=True)
        total = sum(len(t.ids) - 1 for t in targets)
        sums = {"kl": 0.0, "reg": 0.0, "top1": 0.0}
        for t in targets:
            w = (len(t.ids) - 1) / total
            out = head_loss(self.head, self.policy, t)
            (out["loss"] * w).backward()
            for k in sums:
                sums[k] += float(out[k]) * w
        grad = float(torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0))
        loss = sums["kl"] + sums["reg"]
        if not (math.isfinite(loss) and math.isfinite(grad)):
            # a diverged step would poison the head (and a memory publish's pack then fails
            # the run): leave the weights and the optimizer as they were, and count it
            self.opt.zero_grad(set_to_none=True)
            self.skipped += 1
            return {"draft_head_skipped": 1.0}
        before = [p.detach().clone() for p in self.head.parameters()]
        self.opt.step()
        delta = sum(
            float((p.detach() - b).pow(2).sum()) for p, b in zip(self.head.parameters(), before, strict=True)
        )
        self.steps += 1
        return {
            "draft_head_loss": sums["kl"],
            "draft_head_reg": sums["reg"],
            "draft_head_top1": sums["top1"],
            "draft_head_grad": grad,
            "draft_head_delta": delta**0.5,  # L2 norm of this step's change to the head's weights
            "draft_head_skipped": 0.0,
        }


def warm_train(
    trainer: HeadTrainer, targets: list[Targets], steps: int, rows_per_step: int = 4, seed: int = 0
) -> list[dict[str, float]]:
    """``steps`` head steps over random draws of ``rows_per_step`` rows (the warm start)."""
    import random

    rng = random.Random(seed)
    return [trainer.step(rng.sample(targets, min(rows_per_step, len(targets)))) for _ in range(steps)]
