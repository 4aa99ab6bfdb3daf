"""Off-policy corrections in a real trainer step on the tiny model: they act, and the step learns."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pydantic import ValidationError

from rollyard.core import FakeClock, Sample
from rollyard.rollout.config import TrainerConfig
from rollyard.train import build_model, pack_samples
from rollyard.train.objective import CorrectionConfig, LossConfig
from rollyard.train.step import forward_backward
from rollyard.train.trainer import TrainConfig, Trainer


def _behaviour(
    model: torch.nn.Module, trainer: Trainer, batch: list[Sample], shift: list[float]
) -> list[Sample]:
    """Recorded logprobs = the model's own minus ``shift[i]`` on sample i's trained tokens, so
    rho = pi_prox / mu = exp(shift[i]) there."""
    packed = pack_samples(batch, merge=False)
    res = forward_backward(
        model, batch, packed, LossConfig(kind="sft"), trainer.impl, backward=False, keep_logprobs=True
    )
    return [
        s.model_copy(
            update={
                "logprobs": [
                    float(x) - d if m else 0.0
                    for x, m in zip(res.logprobs[i].tolist(), s.loss_mask, strict=True)
                ]
            }
        )
        for i, (s, d) in enumerate(zip(batch, shift, strict=True))
    ]


@pytest.mark.parametrize(
    ("correction", "decoupled", "acted"),
    [
        (CorrectionConfig(kind="icepop"), False, "is_masked_frac"),  # rho = e^-2 < 0.5: masked
        (CorrectionConfig(kind="token_tis"), True, "is_truncated_frac"),  # rho = e^1 > 2: truncated
        (CorrectionConfig(kind="seq_mis", clip=4.0), True, "is_masked_frac"),
    ],
)
def test_a_correction_acts_in_a_trainer_step_and_the_step_learns(
    group: Callable[..., list[Sample]], correction: CorrectionConfig, decoupled: bool, acted: str
) -> None:
    model = build_model("test", seed=0)
    trainer = Trainer(
        model,
        TrainConfig(lr=1e-3, loss=LossConfig(kind="ppo"), correction=correction, decoupled=decoupled),
        clock=FakeClock(),
    )
    batch = group(4, prompt=8, completions=4, completion=5)
    batch = _behaviour(model, trainer, batch, [0.0, 1.0, -2.0, 0.0])
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    m = trainer.train_step(batch)
    assert 0.0 < m[acted] < 1.0  # acted on some tokens, not all
    assert m["is_ratio_p10"] < m["is_ratio_p90"]  # the ratio's spread is reported
    assert m["grad_norm"] > 0 and not m["skipped"]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_run_config_switches_a_correction_on_and_refuses_weights_without_decoupled() -> None:
    cfg = TrainerConfig.model_validate({"correction": {"kind": "token_tis", "clip": 3.0}, "decoupled": True})
    train = cfg.train_config()
    assert train.correction.kind == "token_tis" and train.correction.clip == 3.0 and train.decoupled
    with pytest.raises(ValidationError, match="decoupled"):
        TrainerConfig.model_validate({"correction": {"kind": "seq_tis"}})
