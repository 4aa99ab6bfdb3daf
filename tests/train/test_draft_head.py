"""The eagle draft head (``train/draft_head.py``, ``train/draft_online.py``) on a small random
Llama: it learns the policy's next-token distribution, round-trips through vLLM's file format,
and a run's config is checked before anything starts."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rollyard.core.errors import ConfigError
from rollyard.core.sample import Sample
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.drafting.eagle_files import HEAD_DIR, HEAD_FILE, HEAD_PREFIX
from rollyard.train.draft_head import EagleHead, HeadTrainer, load_head, policy_targets, save_head
from rollyard.train.draft_online import (
    OnlineHead,
    check_eagle_policy,
    check_eagle_publish,
    online_head,
    prepare_head,
)
from rollyard.train.memory_publish import MemoryLinks
from rollyard.train.models import build_model
from rollyard.train.publish import WeightPublisher


@pytest.fixture(scope="module")
def policy() -> torch.nn.Module:
    # trainable, as the trainer's policy is: a gradient leaking into it would show as a .grad
    return build_model("test", seed=3).eval().requires_grad_(True)


def _rows(vocab: int, n: int = 6, length: int = 48, seed: int = 0) -> list[list[int]]:
    """Rows that repeat a short phrase, so a policy's next token is learnable from context."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(vocab) for _ in range(5)]
        out.append((phrase * (length // 5 + 1))[:length])
    return out


def test_head_learns_the_policy_and_only_the_head_changes(policy: torch.nn.Module) -> None:
    torch.manual_seed(0)
    head = EagleHead.from_policy(policy)
    before_policy = {k: v.clone() for k, v in policy.state_dict().items()}
    before_head = {k: v.clone() for k, v in head.state_dict().items()}
    targets = policy_targets(policy, _rows(policy.config.vocab_size), topk=16)
    trainer = HeadTrainer(head, policy, topk=16, lr=3e-3)
    stats = [trainer.step(targets) for _ in range(30)]
    # a random policy is nearly flat over its top-16: the KL falls 3.3 -> 2.8 in 30 steps here
    assert stats[-1]["draft_head_loss"] < 0.9 * stats[0]["draft_head_loss"]
    assert stats[-1]["draft_head_top1"] > stats[0]["draft_head_top1"]
    assert all(s["draft_head_grad"] > 0 and s["draft_head_delta"] > 0 for s in stats)
    assert any(not torch.equal(v, head.state_dict()[k]) for k, v in before_head.items())
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in before_policy.items())
    assert all(p.requires_grad and p.grad is None for p in policy.parameters())


def test_a_step_with_a_non_finite_loss_is_skipped(policy: torch.nn.Module) -> None:
    head = EagleHead.from_policy(policy)
    targets = policy_targets(policy, _rows(policy.config.vocab_size, n=2), topk=8)
    trainer = HeadTrainer(head, policy, topk=8, lr=3e-3)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    bad = [replace(t, hidden=torch.full_like(t.hidden, float("nan"))) for t in targets]
    assert trainer.step(bad) == {"draft_head_skipped": 1.0}
    assert (trainer.steps, trainer.skipped) == (0, 1)
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())  # NaN-free
    assert all(p.grad is None for p in head.parameters()) and not trainer.opt.state
    m = trainer.step(targets)  # and the next finite step trains as usual
    assert m["draft_head_skipped"] == 0.0 and m["draft_head_delta"] > 0 and trainer.steps == 1
    assert all(torch.isfinite(p).all() for p in head.parameters())


def test_head_files_are_what_vllm_eagle_loads(policy: torch.nn.Module, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    head = EagleHead.from_policy(policy)
    out = save_head(head, tmp_path / "head", {"x": 1})
    names = set(load_file(str(out / HEAD_FILE)))
    # vLLM's EagleLlamaForCausalLM: fc + layers.0.*, no input norm; embeddings and lm_head shared
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    assert not any("input_layernorm" in n or "embed_tokens" in n or "lm_head" in n for n in names)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLM"]
    again = load_head(out, policy)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in head.state_dict().items())
    save_head(again, out)  # over an existing head: replaced whole, no temp dir left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]


def test_online_head_steps_and_writes_beside_a_version(policy: torch.nn.Module, tmp_path: Path) -> None:
    head_dir = save_head(EagleHead.from_policy(policy), tmp_path / "h0")
    cfg = DraftingConfig(method="eagle", head=str(head_dir), topk=8, rows=2, max_len=32)
    # the model is looked up each step: a multi-rank trainer's ``model`` is a new gathered copy
    current = [build_model("test", seed=4).eval()]
    online = OnlineHead(cfg, lambda: current[0])
    current[0] = policy  # the trainer stepped: the head must learn from this one, not the first
    rows = _rows(policy.config.vocab_size, n=3)
    samples = [
        Sample(
            token_ids=r,
            loss_mask=[0] + [1] * (len(r) - 1),
            logprobs=[0.0] * len(r),
            advantages=[0.0] * len(r),
        )
        for r in rows
    ]
    m = online.step(samples)
    assert m["draft_head_loss"] > 0 and m["draft_head_delta"] > 0 and m["draft_head_steps"] == 1
    assert online.trainer.policy is policy
    online.write_beside(tmp_path / "v000001")
    written = load_head(tmp_path / "v000001" / HEAD_DIR, policy)
    assert all(torch.equal(v, written.state_dict()[k]) for k, v in online.head.state_dict().items())


def test_config_errors(policy: torch.nn.Module, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="auto"):
        DraftingConfig(method="eagle").speculative_config()
    with pytest.raises(ConfigError, match="warm start"):
        prepare_head(DraftingConfig(method="eagle", warm_steps=5), tmp_path, None)
    with pytest.raises(ConfigError, match="has no"):
        prepare_head(DraftingConfig(method="eagle", head=str(tmp_path)), tmp_path, None)
    head_dir = save_head(EagleHead.from_policy(policy), tmp_path / "h")
    cfg = DraftingConfig(method="eagle", head=str(head_dir))
    assert cfg.speculative_config() == {
        "method": "eagle",
        "model": str(head_dir),
        "num_speculative_tokens": 4,
    }

    # checked before the run starts: the policy's family and vocabulary, the CUDA memory publish
    policy.config.save_pretrained(tmp_path / "llama")
    check_eagle_policy(DraftingConfig(method="eagle", topk=policy.config.vocab_size), tmp_path / "llama")
    with pytest.raises(ConfigError, match="vocabulary"):
        check_eagle_policy(
            DraftingConfig(method="eagle", topk=policy.config.vocab_size + 1), tmp_path / "llama"
        )
    from transformers import GPT2Config

    GPT2Config(n_layer=1).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="Llama"):
        check_eagle_policy(DraftingConfig(method="eagle"), tmp_path / "gpt2")
    check_eagle_policy(DraftingConfig(method="ngram"), tmp_path / "gpt2")  # only eagle needs Llama
    import rollyard.engines.launcher as launcher

    check_eagle_publish(cfg, "memory")  # the gloo memory publish carries the head
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launcher, "has_cuda_gpu", lambda: True)
        with pytest.raises(ConfigError, match="NCCL"):
            check_eagle_publish(cfg, "memory")
        check_eagle_publish(cfg, "disk")
        check_eagle_publish(cfg.model_copy(update={"online": False}), "memory")

    class _Trainer:
        model = policy

    def publisher(mode: str) -> WeightPublisher:
        return WeightPublisher([], tmp_path / "weights", base_path=tmp_path, mode=mode)  # type: ignore[arg-type]

    assert online_head(cfg.model_copy(update={"online": False}), _Trainer(), publisher("memory")) is None
    disk = publisher("disk")
    head = online_head(cfg, _Trainer(), disk)
    assert head is not None and disk.beside == head.write_beside
    memory = publisher("memory")
    head = online_head(cfg, _Trainer(), memory)
    assert head is not None and isinstance(memory.links, MemoryLinks) and memory.links.extra is not None
    sent = dict(memory.links.extra())
    assert set(sent) == {HEAD_PREFIX + n for n in head.head.vllm_state_dict()}


def test_auto_head_is_warm_trained_on_the_demos_and_cached(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path / "cache"))
    demos = tmp_path / "demos.jsonl"
    rows = _rows(256, n=3, length=40)
    demos.write_text(
        "".join(
            Sample(
                token_ids=r,
                loss_mask=[0] + [1] * (len(r) - 1),
                logprobs=[0.0] * len(r),
                advantages=[0.0] * len(r),
            ).model_dump_json()
            + "\n"
            for r in rows
        )
    )
    cfg = DraftingConfig(method="eagle", warm_steps=3, topk=8)
    made = prepare_head(cfg, tiny_model_dir, demos)
    head_dir = Path(made.head)
    assert head_dir.parent == tmp_path / "cache" / "models" / "eagle-heads"
    meta = json.loads((head_dir / "rollyard_head.json").read_text())
    assert meta["warm_steps"] == 3 and meta["warm"][0]["draft_head_delta"] > 0
    stamp = (head_dir / HEAD_FILE).stat().st_mtime_ns
    assert prepare_head(cfg, tiny_model_dir, demos).head == made.head  # a cache hit: not remade
    assert (head_dir / HEAD_FILE).stat().st_mtime_ns == stamp
    other = prepare_head(cfg.model_copy(update={"warm_steps": 2}), tiny_model_dir, demos)
    assert other.head != made.head
    reseeded = prepare_head(cfg, tiny_model_dir, demos, seed=1)  # the warm start's draws differ
    assert reseeded.head not in (made.head, other.head)
