"""Seeded sample batches for the trainer tests (a plain module so spawned workers can import it)."""

from __future__ import annotations

import random

from rollyard.core import Sample


def make_group(
    seed: int, *, prompt: int = 12, completions: int = 4, completion: int = 6, vocab: int = 500
) -> list[Sample]:
    """A GRPO-style group: one prompt, several sampled completions with their own advantages."""
    rng = random.Random(seed)
    p = [rng.randrange(3, vocab) for _ in range(prompt)]
    out = []
    for _ in range(completions):
        c = [rng.randrange(3, vocab) for _ in range(completion)]
        adv = rng.gauss(0, 1)
        out.append(
            Sample(
                token_ids=p + c,
                loss_mask=[0] * prompt + [1] * completion,
                logprobs=[0.0] * prompt + [-rng.random() * 3 - 3 for _ in c],
                advantages=[adv] * (prompt + completion),
            )
        )
    return out
