"""save_weights: a versioned Hugging Face dir, written atomically, never with non-finite weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from rollyard.core import ConfigError, TrainError
from rollyard.train import build_model
from rollyard.train.checkpoint import save_weights


def test_saved_version_loads_back_with_identical_logits(tmp_path: Path) -> None:
    model = build_model("test", seed=3)
    path = save_weights(model, tmp_path, 7)
    assert path == tmp_path / "v000007"
    assert json.loads((path / "rollyard_version.json").read_text()) == {"version": 7}
    assert any(p.suffix == ".safetensors" for p in path.iterdir())
    loaded = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([[5, 9, 11, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert [p.name for p in tmp_path.iterdir()] == ["v000007"]  # no temporary dir left behind


def test_rewriting_a_version_replaces_it_whole(tmp_path: Path) -> None:
    save_weights(build_model("test", seed=1), tmp_path, 1)
    second = build_model("test", seed=2)
    path = save_weights(second, tmp_path, 1)
    loaded = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert torch.equal(loaded.model.embed_tokens.weight, second.model.embed_tokens.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000001"]


def test_non_finite_weights_are_never_published(tmp_path: Path) -> None:
    model = build_model("test", seed=1)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    with pytest.raises(TrainError, match="non-finite"):
        save_weights(model, tmp_path, 2)
    assert not (tmp_path / "v000002").exists()


def test_negative_version_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        save_weights(build_model("test"), tmp_path, -1)
