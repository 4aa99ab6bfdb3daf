"""The local model: deterministic for a seed, loadable, and bad directories fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rollyard.core import ConfigError
from rollyard.engines.tiny_model import check_model_dir, create_model, model_config_for


def test_same_seed_gives_identical_files_and_other_seed_differs(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = create_model(tmp_path / "m", seed=0)
    for name in ("tokenizer.json", "config.json"):
        assert (again / name).read_text() == (tiny_model_dir / name).read_text()
    a = load_file(str(again / "model.safetensors"))
    b = load_file(str(tiny_model_dir / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)
    other = create_model(tmp_path / "m1", seed=1)
    c = load_file(str(other / "model.safetensors"))
    assert any(not (a[k] == c[k]).all() for k in a)


def test_tiny_and_small_sizes(tiny_model_dir: Path) -> None:
    meta = json.loads((tiny_model_dir / "rollyard.json").read_text())
    assert 2_000_000 < meta["params"] < 6_000_000
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        small = LlamaForCausalLM(model_config_for("small"))
    assert 20_000_000 < small.num_parameters() < 40_000_000
    with pytest.raises(ConfigError, match="size"):
        model_config_for("huge")


def test_model_dir_checks(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert check_model_dir(tiny_model_dir) == tiny_model_dir
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_dir(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bad / name).write_text("{}")
    (bad / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="corrupt"):
        check_model_dir(bad)


def test_refuses_to_overwrite_a_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("keep me")
    with pytest.raises(ConfigError, match="not empty"):
        create_model(tmp_path / "x")
    assert (tmp_path / "x" / "f").read_text() == "keep me"


def test_max_context_sets_the_models_positions_and_engines_may_not_exceed_them(tmp_path: Path) -> None:
    from rollyard.core.errors import ConfigError
    from rollyard.engines.launcher import VLLMServer
    from rollyard.engines.tiny_model import model_positions

    path = create_model(tmp_path / "short", seed=0, max_context=1024)
    assert model_positions(path) == 1024
    assert json.loads((path / "tokenizer_config.json").read_text())["model_max_length"] == 1024
    with pytest.raises(ConfigError, match="exceeds the model's 1024 positions"):
        VLLMServer(path, max_model_len=2048).start()  # refused before any process starts
    with pytest.raises(ConfigError, match="too small"):
        create_model(tmp_path / "tiny", max_context=64)
