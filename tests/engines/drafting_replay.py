"""Replay recorded samples of one group through a drafter, offline, as vLLM would step them.

All samples decode at once (one engine step per round). Each step a request's draft is checked
against its recorded continuation: the matching prefix is accepted, then one more token (vLLM's
bonus or corrected token). For a draft without probabilities vLLM accepts a token with the
target's probability of it, which is the chance that an undrafted sample would have been that
token, so accepted counts replayed over real samples estimate the engine's without running it.
How ``docs/drafting.md`` compared drafters and settings on SmolLM2 samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ReplayStats:
    drafts: int  # steps in which a request proposed at least one token
    accepted: int
    tokens: int

    @property
    def acceptance_len(self) -> float:
        """vLLM's figure: 1 + accepted / drafts."""
        return 1.0 + self.accepted / max(self.drafts, 1)

    @property
    def share(self) -> float:
        """The fraction of all tokens that came from accepted drafts."""
        return self.accepted / max(self.tokens, 1)


def replay(drafter: Any, prompt: Sequence[int], outputs: Sequence[Sequence[int]]) -> ReplayStats:
    """Decode ``outputs`` (one per sibling, after ``prompt``) through ``drafter.propose``."""
    n_prompt = len(prompt)
    width = n_prompt + max((len(o) for o in outputs), default=0) + 1
    rows = np.zeros((len(outputs), width), dtype=np.int32)
    rows[:, :n_prompt] = prompt
    pos = [0] * len(outputs)
    drafts: list[list[int]] = [[] for _ in outputs]
    n_drafts = accepted = 0
    while any(p < len(o) for p, o in zip(pos, outputs, strict=True)):
        sampled: list[list[int]] = []
        for i, out in enumerate(outputs):
            if pos[i] >= len(out):
                sampled.append([])
                continue
            a = 0
            while a < len(drafts[i]) and pos[i] + a < len(out) and drafts[i][a] == out[pos[i] + a]:
                a += 1
            if drafts[i]:
                n_drafts += 1
                accepted += a
            new = list(out[pos[i] : pos[i] + a + 1])
            rows[i, n_prompt + pos[i] : n_prompt + pos[i] + len(new)] = new
            pos[i] += len(new)
            sampled.append(new)
        lengths = np.array([n_prompt + p for p in pos])
        drafts = [
            d if pos[i] < len(outputs[i]) else []
            for i, d in enumerate(drafter.propose(sampled, lengths, rows))
        ]
    return ReplayStats(n_drafts, accepted, sum(len(o) for o in outputs))
