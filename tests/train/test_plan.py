"""``rollyard plan``: per-rank memory from a meta-device model, checked by hand on a tiny config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollyard.cli import _register, app
from rollyard.core.errors import ConfigError
from rollyard.train.plan import GB, PlanSetup, model_config, plan_memory


def test_tiny_plan_matches_a_hand_calculation() -> None:
    # the "test" Llama: vocab 512, hidden 64, MLP 128, 2 layers, 4 heads (dim 16), 2 KV heads, tied
    layer = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k+v, o, MLP, 2 norms
    root = 512 * 64 + 64  # embedding (= the tied head) and the final norm
    params = root + 2 * layer
    setup = PlanSetup(world_size=2, token_budget=100, logits_chunk=32, reserve_gb=0.0, gpu_mem_gb=1.0)
    plan = plan_memory(model_config("test"), setup)
    assert plan.params == plan.trainable == params == 106_816
    per_token = 4 * 64 + 2 * 64 + 2 * 32 + 4 * 128  # norms in/out, q and attention out, k v, MLP
    expect = {
        "parameters": params * 4 / 2,
        "gradients": params * 4 / 2,
        "optimizer": params * 8 / 2,
        "fsdp gather buffers": (root + 3 * layer) * 4,
        "activations": 2 * 100 * per_token * 4,
        "logits": 32 * 512 * 8 + 512 * 64 * 4,
        "runtime reserve": 0.0,
    }
    assert plan.rows == pytest.approx(expect)
    assert plan.headroom_gb == pytest.approx(1.0 - sum(expect.values()) / GB)
    # checkpointing keeps each layer's input and one layer's activations
    ac = plan_memory(model_config("test"), PlanSetup(**{**setup.__dict__, "activation_checkpointing": True}))
    assert ac.rows["activations"] == 2 * 100 * 64 * 4 + 100 * per_token * 4
    assert ac.headroom_other_gb == pytest.approx(plan.headroom_gb)


def test_bf16_adds_an_fp32_master_and_fsdp2_shards_by_world_size() -> None:
    cfg = model_config("smollm2-135m")
    one = plan_memory(cfg, PlanSetup(world_size=1, dtype="bf16"))
    four = plan_memory(cfg, PlanSetup(world_size=4, dtype="bf16"))
    rep = plan_memory(cfg, PlanSetup(world_size=4, dtype="bf16", parallel="replicate"))
    states = ("parameters", "gradients", "optimizer")
    assert sum(one.rows[k] for k in states) == 16 * one.params  # 2 + 2 + (4 + 4) + 4 master
    assert sum(four.rows[k] for k in states) == pytest.approx(sum(one.rows[k] for k in states) / 4)
    assert all(rep.rows[k] == one.rows[k] for k in states) and "fsdp gather buffers" not in rep.rows


def test_qwen_7b_fits_8_x_80gb_with_room_and_32b_does_not() -> None:
    setup = PlanSetup(world_size=8, dtype="bf16", activation_checkpointing=True, gpu_mem_gb=80)
    seven = plan_memory(model_config("qwen2.5-7b"), setup)
    assert 7.5e9 < seven.params < 7.7e9  # Qwen2.5-7B: 7.61B
    assert seven.headroom_gb >= 20
    big = plan_memory(model_config("qwen2.5-32b"), setup)
    assert 32e9 < big.params < 33.5e9 and big.headroom_gb < seven.headroom_gb - 40


def test_cli_plan_reads_the_train_config_and_a_config_json(tmp_path: Path) -> None:
    _register()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({**model_config("test").to_dict(), "model_type": "llama"}))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model: {{path: {hf}}}\ntrainer: {{token_budget: 100, logits_chunk: 32, world_size: 2}}\n"
    )
    res = CliRunner().invoke(app, ["plan", str(cfg), "--gpu-mem-gb", "1", "--reserve-gb", "0"])
    assert res.exit_code == 0, res.output
    want = plan_memory(
        model_config(hf),
        PlanSetup(world_size=2, token_budget=100, logits_chunk=32, gpu_mem_gb=1, reserve_gb=0),
    )
    assert f"headroom per rank: {want.headroom_gb:.2f} GB" in res.output
    assert "2 rank(s) x 1 GB, fsdp2, fp32, 100 tokens per micro-batch, logits chunk 32" in res.output


def test_unknown_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no model config"):
        model_config("gpt-9")
