"""The worker extension re-packs only an eagle head's own GEMMs after loading it, not the
target's embeddings and ``lm_head`` the drafter shares (``engines/vllm_worker_ext.py``); and
``rollyard engine serve --drafting eagle`` takes its head as ``--draft-head``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rollyard.core.errors import ConfigError

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


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--drafting", "eagle"], "--draft-head"),  # head auto belongs to a train run
        (["--drafting", "ngram", "--draft-head", "."], "--draft-head"),
        (["--drafting", "eagle", "--draft-head", "."], "no model.safetensors"),
    ],
)
def test_engine_serve_eagle_needs_a_head_dir(flags: list[str], says: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollyard.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["engine", "serve", "--model", str(tmp_path), *flags])
    assert isinstance(res.exception, ConfigError) and says in res.exception.message
