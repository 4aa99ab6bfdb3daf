"""The online eagle head in the trainer's checkpoint (``OnlineHead.state_dict``, saved under
``extra_state`` by ``Trainer.save``): a run stopped after a checkpoint and resumed trains the
head on exactly as a run that never stopped, and an engine (re)started on a published version
serves the head saved beside it (``served_head``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from rollyard.core.errors import TrainError
from rollyard.core.sample import Sample
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.drafting.eagle_files import HEAD_DIR
from rollyard.train.draft_head import EagleHead, save_head
from rollyard.train.draft_online import OnlineHead, online_head, served_head
from rollyard.train.models import build_model
from rollyard.train.publish import WeightPublisher
from rollyard.train.trainer import TrainConfig, Trainer


def _samples(vocab: int, seed: int, n: int = 3, length: int = 40) -> list[Sample]:
    """Rows repeating a short phrase: a next token the head can learn from context."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(vocab) for _ in range(5)]
        r = (phrase * (length // 5 + 1))[:length]
        zeros = [0.0] * len(r)
        out.append(Sample(token_ids=r, loss_mask=[0] + [1] * (len(r) - 1), logprobs=zeros, advantages=zeros))
    return out


def _weights(h: OnlineHead) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in h.head.state_dict().items()}


def test_a_resumed_head_trains_on_as_if_the_run_never_stopped(tmp_path: Path) -> None:
    policy = build_model("test", seed=3).eval()
    cfg = DraftingConfig(
        method="eagle", head=str(save_head(EagleHead.from_policy(policy), tmp_path / "h0")), topk=8, rows=2
    )
    steps = [_samples(policy.config.vocab_size, seed=s) for s in range(4)]

    straight = OnlineHead(cfg, lambda: policy)
    for s in steps:
        straight.step(s)

    stopped = OnlineHead(cfg, lambda: policy)
    for s in steps[:2]:
        stopped.step(s)
    # through the trainer's own checkpoint: staged, renamed, loaded back from state.pt
    trainer = Trainer(build_model("test", seed=5), TrainConfig())
    trainer.save(tmp_path / "ckpt", extra_state={"draft_head": stopped.state_dict()})
    extra = Trainer(build_model("test", seed=5), TrainConfig()).load(tmp_path / "ckpt")

    class _Trainer:
        model = policy

    publisher = WeightPublisher([], tmp_path / "weights", base_path=tmp_path, mode="disk")  # type: ignore[arg-type]
    resumed = online_head(cfg, _Trainer(), publisher, resumed=extra["draft_head"])
    assert resumed is not None and publisher.beside == resumed.write_beside
    start = _weights(OnlineHead(cfg, lambda: policy))
    saved = _weights(stopped)
    assert any(not torch.equal(v, start[k]) for k, v in saved.items())  # two steps moved it
    assert all(torch.equal(v, saved[k]) for k, v in _weights(resumed).items())  # not the start
    assert (resumed.trainer.steps, resumed.trainer.skipped) == (2, 0)
    for s in steps[2:]:
        resumed.step(s)
    # AdamW's moments came back too: without them the third step would differ
    end = _weights(straight)
    assert all(torch.equal(v, end[k]) for k, v in _weights(resumed).items())
    assert resumed.trainer.steps == straight.trainer.steps == 4

    fresh_optimizer = OnlineHead(cfg, lambda: policy)
    fresh_optimizer.head.load_state_dict(saved)
    for s in steps[2:]:
        fresh_optimizer.step(s)
    assert any(not torch.equal(v, end[k]) for k, v in _weights(fresh_optimizer).items())


def test_a_checkpointed_head_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    policy = build_model("test", seed=3).eval()
    cfg = DraftingConfig(method="eagle", head=str(save_head(EagleHead.from_policy(policy), tmp_path / "h")))
    head = OnlineHead(cfg, lambda: policy)
    state = head.state_dict()
    state["head"] = {k: v[..., :1] for k, v in state["head"].items()}
    with pytest.raises(TrainError, match="does not fit"):
        head.load_state_dict(state)


def test_an_engine_restarted_on_a_version_serves_the_head_beside_it(tmp_path: Path) -> None:
    policy = build_model("test", seed=3).eval()
    start = save_head(EagleHead.from_policy(policy), tmp_path / "h0")
    cfg = DraftingConfig(method="eagle", head=str(start))
    online = OnlineHead(cfg, lambda: policy)
    online.write_beside(tmp_path / "v000003")
    assert served_head(cfg, tmp_path / "v000003").head == str(tmp_path / "v000003" / HEAD_DIR)
    (tmp_path / "base").mkdir()  # the starting policy's dir, or a frozen head's versions
    assert served_head(cfg, tmp_path / "base") == cfg
    grouped = DraftingConfig(method="grouped_suffix")
    assert served_head(grouped, tmp_path / "v000003") == grouped


def test_the_online_head_continues_the_warm_ups_optimizer(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh AdamW's first step moves every weight by lr (m / sqrt(v) is the gradient's sign):
    on a warm head that undid its training (the quick bench: KL 1.08 -> 40.2). The online head
    starts from the warm-up's AdamW instead, so its first step is a late warm-up step, not that."""
    from transformers import AutoModelForCausalLM

    from rollyard.train.draft_head import HEAD_OPTIM, head_loss, policy_targets
    from rollyard.train.draft_online import prepare_head

    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path / "cache"))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    samples = _samples(policy.config.vocab_size, seed=0)
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(s.model_dump_json() + "\n" for s in samples))
    warm = 30
    cfg = prepare_head(
        DraftingConfig(method="eagle", warm_steps=warm, topk=8, rows=3, lr=1e-3), tiny_model_dir, demos
    )
    assert (Path(cfg.head) / HEAD_OPTIM).is_file()
    online = OnlineHead(cfg, lambda: policy)
    assert {int(s["step"]) for s in online.trainer.opt.state.values()} == {warm}
    targets = policy_targets(policy, [s.token_ids for s in samples], topk=8)

    def kl() -> float:
        with torch.no_grad():
            return sum(float(head_loss(online.head, policy, t)["kl"]) for t in targets) / len(targets)

    before = kl()
    m = online.step(samples)
    n = sum(p.numel() for p in online.head.parameters())
    assert m["draft_head_delta"] < 0.9 * 1e-3 * n**0.5  # a fresh AdamW's first step is lr * sqrt(n)
    assert kl() <= before  # one more step on the rows it warmed on does not undo the warm-up
