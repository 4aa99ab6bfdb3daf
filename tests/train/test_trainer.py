"""The trainer step: updates, metrics, NaN skipping, bad input and exact resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rollyard.core import DataError, FakeClock, Sample
from rollyard.core.errors import ConfigError
from rollyard.train import build_model
from rollyard.train.objective import LossConfig
from rollyard.train.trainer import TrainConfig, Trainer


def _trainer(seed: int = 0, **cfg: object) -> Trainer:
    config = TrainConfig(lr=1e-3, **cfg)  # type: ignore[arg-type]
    return Trainer(build_model("test", seed=seed), config, clock=FakeClock())


def _weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def test_sft_steps_lower_the_loss_on_a_fixed_batch(group: Callable[..., list[Sample]]) -> None:
    trainer = _trainer(loss=LossConfig(kind="sft"))
    batch = group(0)
    first = trainer.train_step(batch)["loss"]
    for _ in range(5):
        last = trainer.train_step(batch)["loss"]
    assert last < first
    assert trainer.step == 6


def test_rl_step_reports_metrics_and_merge_ratio(group: Callable[..., list[Sample]]) -> None:
    trainer = _trainer()
    m = trainer.train_step(group(1, prompt=20, completions=4, completion=5))
    for key in ("loss", "grad_norm", "entropy", "clip_frac", "kl", "tokens_per_s"):
        assert key in m and m[key] == m[key]  # present and not NaN
    assert m["merged_unmerged_ratio"] == pytest.approx((20 + 4 * 5) / (4 * 25))
    assert m["entropy"] > 0


def test_a_cut_tree_never_forwards_more_than_the_unmerged_batch() -> None:
    history = [(7 * k) % 500 + 3 for k in range(120)]  # one call-by-call trajectory, a branch off it
    samples = [
        Sample(
            token_ids=ids,
            loss_mask=[0] + [1] * (len(ids) - 1),
            logprobs=[-1.0] * len(ids),
            advantages=[1.0] * len(ids),
        )
        for ids in (history[:40], history[:80], history, [*history[:60], 1, 2])
    ]
    for cap in (16, 50, 100, 1000):
        m = _trainer(max_tree_tokens=cap, token_budget=cap).train_step(samples)
        assert m["merged_unmerged_ratio"] <= 1.0
    assert m["merged_unmerged_ratio"] == pytest.approx(122 / (40 + 80 + 120 + 62))


def test_merged_and_unmerged_trainers_make_the_same_update(group: Callable[..., list[Sample]]) -> None:
    batch = group(2)
    # A large Adam eps keeps the update a smooth function of the gradient (at eps=1e-8 the first
    # step is ~lr*sign(g), which flips on float noise in near-zero gradients).
    a, b = _trainer(merge=True, eps=1e-2), _trainer(merge=False, token_budget=1, eps=1e-2)
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    wa, wb = _weights(a), _weights(b)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def test_non_finite_loss_skips_the_step_and_keeps_weights(group: Callable[..., list[Sample]]) -> None:
    trainer = _trainer()
    before = _weights(trainer)
    # NaN hidden states into the head: the chunked head (the default) and the full logits alike
    hook = trainer.model.model.norm.register_forward_hook(lambda mod, inp, out: out * float("nan"))
    m = trainer.train_step(group(3))
    hook.remove()
    assert m["skipped"] == 1.0 and trainer.skipped == 1 and trainer.step == 0
    after = _weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    m = trainer.train_step(group(3))
    assert m["skipped"] == 0.0 and trainer.step == 1


def test_batch_without_trained_tokens_is_rejected() -> None:
    s = Sample(token_ids=[5, 6, 7], loss_mask=[0, 0, 0], logprobs=[0.0] * 3, advantages=[1.0] * 3)
    with pytest.raises(DataError, match="no trained token"):
        _trainer().train_step([s])


def test_token_outside_the_vocabulary_is_rejected() -> None:
    s = Sample(token_ids=[5, 10_000], loss_mask=[0, 1], logprobs=[0.0, -1.0], advantages=[1.0, 1.0])
    with pytest.raises(DataError, match="vocab"):
        _trainer().train_step([s])


def test_sample_longer_than_the_context_is_rejected() -> None:
    n = 2049
    s = Sample(token_ids=[5] * n, loss_mask=[0] + [1] * (n - 1), logprobs=[0.0] * n, advantages=[1.0] * n)
    with pytest.raises(DataError, match="context"):
        _trainer().train_step([s])


def test_resume_from_checkpoint_equals_training_straight_through(
    group: Callable[..., list[Sample]], tmp_path: Path
) -> None:
    batches = [group(10 + k) for k in range(4)]
    straight = _trainer()
    for b in batches:
        straight.train_step(b)

    first = _trainer()
    for b in batches[:2]:
        first.train_step(b)
    first.save(tmp_path / "ckpt", extra_state={"buffer": {"head": 7}})
    torch.manual_seed(1234)  # disturb the RNG: the checkpoint must restore it

    resumed = _trainer(seed=99)  # different init: everything must come from the checkpoint
    extra = resumed.load(tmp_path / "ckpt")
    assert extra == {"buffer": {"head": 7}}
    assert resumed.step == 2
    for b in batches[2:]:
        resumed.train_step(b)
    ws, wr = _weights(straight), _weights(resumed)
    for k in ws:
        assert torch.equal(ws[k], wr[k]), k


def test_checkpoint_overwrite_leaves_no_temporary_dirs(
    group: Callable[..., list[Sample]], tmp_path: Path
) -> None:
    t = _trainer()
    t.train_step(group(4))
    t.save(tmp_path / "ckpt")
    t.train_step(group(5))
    t.save(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    other = _trainer(seed=5)
    other.load(tmp_path / "ckpt")
    assert other.step == 2


def test_train_layers_updates_only_the_top_layers_and_the_final_norm(
    group: Callable[..., list[Sample]],
) -> None:
    full = _trainer()
    top = _trainer(train_layers=1)
    n_layers = len(top.model.model.layers)  # type: ignore[union-attr]
    assert 0 < top.trainable < full.trainable
    before = _weights(top)
    m = top.train_step(group(2))
    assert m["trainable_params"] == top.trainable
    changed = {k for k, v in _weights(top).items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith((f"model.layers.{n_layers - 1}.", "model.norm.")) for k in changed)
    with pytest.raises(ConfigError, match=f"the model has {n_layers} layers"):
        _trainer(train_layers=n_layers + 1)
