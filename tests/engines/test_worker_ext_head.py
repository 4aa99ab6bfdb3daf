"""The worker extension re-packs only an eagle head's own GEMMs after loading it, not the
target's embeddings and ``lm_head`` the drafter shares (``engines/vllm_worker_ext.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

ext = pytest.importorskip("rollyard.engines.vllm_worker_ext")


def _packed(n_in: int, n_out: int) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=False)
    layer.cpu_linear = lambda x: x  # what vLLM's CPU dispatch leaves on a packed GEMM
    return layer


def _drafter_model() -> nn.Module:
    """vLLM's ``EagleLlamaForCausalLM`` layout: ``model.{embed_tokens, fc, layers.0}`` and ``lm_head``."""
    root = nn.Module()
    root.model = nn.Module()
    root.model.embed_tokens = _packed(8, 32)
    root.model.fc = _packed(16, 8)
    root.model.layers = nn.ModuleList([nn.Module()])
    root.model.layers[0].qkv_proj = _packed(8, 24)
    root.model.layers[0].down_proj = _packed(8, 8)
    root.model.layers[0].norm = nn.LayerNorm(8)
    root.lm_head = _packed(8, 32)
    return root


def test_head_only_repack_leaves_out_the_shared_target_modules() -> None:
    model = _drafter_model()
    head = ext._gemms(model, head_only=True)
    assert {id(m) for m in head} == {
        id(model.model.fc),
        id(model.model.layers[0].qkv_proj),
        id(model.model.layers[0].down_proj),
    }
    assert len(ext._gemms(model)) == 5  # the target's repack takes every packed GEMM


def test_head_tensors_need_an_eagle_drafter() -> None:
    with pytest.raises(RuntimeError, match="no eagle drafter"):
        ext.load_head_tensors(None, [("fc.weight", torch.zeros(8, 16))])
