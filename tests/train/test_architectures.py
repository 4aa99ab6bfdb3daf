"""The trainer on any transformers causal LM: tree attention is exact on Llama, Qwen2 and Qwen3
shapes; activation checkpointing changes no gradient; dtype and old checkpoints."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from train_batches import make_group

from rollyard.core import ConfigError, Sample
from rollyard.train import pack_samples, set_attention
from rollyard.train.checkpoint import rng_state
from rollyard.train.models import build_model
from rollyard.train.objective import LossConfig
from rollyard.train.step import forward_backward
from rollyard.train.trainer import TrainConfig, Trainer

_SHAPE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def _tiny(arch: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = {"head_dim": 16} if arch == "qwen3" else {}
    config = AutoConfig.for_model(arch, **_SHAPE, **extra)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(torch.float32)


def _tree(seed: int) -> list[Sample]:
    """Two prompts, each with branching completions (some sharing more than the prompt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(2):
        prompt = [rng.randrange(256) for _ in range(9)]
        stem = prompt + [rng.randrange(256) for _ in range(3)]
        for base in (prompt, stem, stem):
            ids = base + [rng.randrange(256) for _ in range(rng.randrange(2, 7))]
            mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
            out.append(
                Sample(
                    token_ids=ids,
                    loss_mask=mask,
                    logprobs=[-rng.random() * 3 for _ in ids],
                    advantages=[rng.gauss(0, 1)] * len(ids),
                )
            )
    return out


def _logprobs_and_grads(model: torch.nn.Module, samples: list[Sample], **pack: Any) -> tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    packed = pack_samples(samples, **pack)
    res = forward_backward(
        model, samples, packed, LossConfig(kind="ppo"), "rollyard_tree", keep_logprobs=True
    )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return res.logprobs, grads


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_merged_tree_equals_unmerged_on_each_architecture(arch: str) -> None:
    model = _tiny(arch)
    assert type(model).__name__.lower().startswith(arch)
    set_attention(model, "rollyard_tree")
    samples = _tree(seed=len(arch))
    lp_m, g_m = _logprobs_and_grads(model, samples)
    lp_u, g_u = _logprobs_and_grads(model, samples, merge=False, token_budget=1)
    assert lp_m.keys() == lp_u.keys() == set(range(len(samples)))
    for i in lp_u:
        torch.testing.assert_close(lp_m[i], lp_u[i], atol=1e-5, rtol=0)
    assert g_m.keys() == g_u.keys() and g_u
    for name, g in g_u.items():
        assert float((g_m[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()) + 1e-8, name


def _step_grads(checkpointing: bool) -> dict[str, torch.Tensor]:
    cfg = TrainConfig(lr=1e-3, activation_checkpointing=checkpointing, token_budget=40)
    trainer = Trainer(build_model("test", seed=3), cfg)
    assert trainer.model.is_gradient_checkpointing == checkpointing  # type: ignore[union-attr]
    trainer.train_step(make_group(7, prompt=10, completions=4, completion=6))
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    plain, recomputed = _step_grads(False), _step_grads(True)
    assert plain.keys() == recomputed.keys() and any(float(g.abs().max()) > 0 for g in plain.values())
    for name, g in plain.items():
        torch.testing.assert_close(recomputed[name], g, atol=1e-6, rtol=0, msg=name)


def test_bf16_on_cpu_is_refused() -> None:
    with pytest.raises(ConfigError, match="bf16 needs a CUDA device"):
        Trainer(build_model("test"), TrainConfig(dtype="bf16"))


def test_a_single_file_checkpoint_of_the_earlier_format_still_loads(tmp_path: Path) -> None:
    """model.safetensors (tied head left out) + optimizer.pt keyed by parameter position."""
    batches = [make_group(20 + k) for k in range(2)]
    straight = Trainer(build_model("test", seed=1), TrainConfig(lr=1e-3))
    straight.train_step(batches[0])
    old = tmp_path / "old"
    old.mkdir()
    weights = {k: v.clone() for k, v in straight.model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, str(old / "model.safetensors"))
    torch.save(straight.optimizer.state_dict(), old / "optimizer.pt")
    torch.save({"rng": rng_state(), "extra_state": {"v": 1}}, old / "state.pt")
    (old / "trainer.json").write_text(json.dumps({"step": 1, "skipped": 0}))

    resumed = Trainer(build_model("test", seed=9), TrainConfig(lr=1e-3))
    assert resumed.load(old) == {"v": 1} and resumed.step == 1
    for b in (straight, resumed):
        b.train_step(batches[1])  # the same update only if AdamW's moments were restored
    for k, v in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
