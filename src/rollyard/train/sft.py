"""Supervised warm start on demonstrations, through the same ``Trainer`` as RL (loss kind ``sft``).

Demonstrations are JSONL: ``{"prompt_ids": [...], "completion_ids": [...]}`` per line (the
completion is trained, the prompt is not), or a full ``Sample`` object per line.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollyard.core.errors import ConfigError, DataError
from rollyard.core.sample import Sample
from rollyard.train.checkpoint import save_weights
from rollyard.train.objective import LossConfig
from rollyard.train.trainer import TrainConfig, Trainer

logger = logging.getLogger(__name__)


def demonstration_sample(record: dict[str, Any]) -> Sample:
    """One JSONL record as a Sample: completion tokens trained, prompt tokens only context."""
    try:
        if "token_ids" in record:
            return Sample.model_validate(record)
        prompt, completion = list(record["prompt_ids"]), list(record["completion_ids"])
    except KeyError as e:
        raise DataError(f"a demonstration needs prompt_ids and completion_ids (missing {e})") from e
    except ValidationError as e:
        raise DataError(f"bad sample record: {e.errors()[0]['msg']}") from e
    if not prompt or not completion:
        raise DataError("a demonstration needs a non-empty prompt and completion")
    n = len(prompt) + len(completion)
    return Sample(
        token_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        logprobs=[0.0] * n,
        advantages=[0.0] * n,
    )


def load_demonstrations(path: str | Path) -> list[Sample]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no demonstration file at {p}")
    out = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{lineno}: not JSON ({e.msg})") from e
        try:
            out.append(demonstration_sample(record))
        except DataError as e:
            raise DataError(f"{p}:{lineno}: {e.message}") from e
    if not out:
        raise DataError(f"{p} holds no demonstrations")
    return out


def batches(samples: Sequence[Sample], batch_size: int, seed: int) -> Iterator[list[Sample]]:
    """Endless shuffled epochs of ``batch_size`` samples (the last short batch of an epoch is kept)."""
    rng = random.Random(seed)
    order = list(range(len(samples)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            yield [samples[j] for j in order[i : i + batch_size]]


def run_sft(
    model_dir: str | Path,
    data: str | Path,
    out_dir: str | Path,
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 1e-4,
    seed: int = 0,
    token_budget: int = 8192,
    train_layers: int | None = None,
) -> dict[str, Any]:
    """Train ``steps`` SFT steps from ``model_dir`` and write ``out_dir/v{steps}`` (HF dir + tokenizer);
    ``train_layers``: only the top N decoder layers (long CLI prompts cost less to backpropagate)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch_size < 1:
        raise ConfigError("steps and batch size must be >= 1")
    if not Path(model_dir).is_dir():
        raise ConfigError(f"no model directory at {model_dir}")
    samples = load_demonstrations(data)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):
        tokenizer = None
    config = TrainConfig(
        lr=lr, token_budget=token_budget, loss=LossConfig(kind="sft"), train_layers=train_layers
    )
    trainer = Trainer(model, config)
    history = []
    for step, batch in zip(range(steps), batches(samples, batch_size, seed), strict=False):
        metrics = trainer.train_step(batch)
        history.append(metrics["loss"])
        logger.info("sft step=%d loss=%.4f grad_norm=%.3f", step + 1, metrics["loss"], metrics["grad_norm"])
    path = save_weights(model, out_dir, trainer.step, tokenizer=tokenizer)
    return {"weights": str(path), "steps": trainer.step, "skipped": trainer.skipped, "losses": history}
