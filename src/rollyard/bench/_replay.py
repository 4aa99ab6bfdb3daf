"""Replay recorded samples of one group through a drafter, offline, as vLLM would step them.

Requests decode ``concurrency`` at a time in the order given, as the benchmark's client sends
them (a request starts in the step after one ends). Each step a request's draft is checked
against its recorded continuation: the matching prefix is accepted, then one more token (vLLM's
bonus or corrected token). For a draft without probabilities vLLM accepts a token with the
target's probability of it, which is the chance that an undrafted sample would have been that
token, so accepted counts replayed over real samples estimate the engine's without running it.
``rollyard bench drafting`` replays the no-drafting engine's own samples beside each live run.
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


def replay(
    drafter: Any, prompt: Sequence[int], outputs: Sequence[Sequence[int]], concurrency: int | None = None
) -> ReplayStats:
    """Decode ``outputs`` (one per sibling, after ``prompt``) through ``drafter.propose``.

    The batch's rows are the running requests only, in start order, as vLLM's persistent batch
    would hold them; a finished request's row is reused by the next one to start."""
    n_prompt = len(prompt)
    width = n_prompt + max((len(o) for o in outputs), default=0) + 1
    limit = len(outputs) if concurrency is None else max(1, concurrency)
    pos = [0] * len(outputs)
    drafts: dict[int, list[int]] = {}
    waiting = [i for i, o in enumerate(outputs) if o]
    running: list[int] = []
    rows = np.zeros((limit, width), dtype=np.int32)
    n_drafts = accepted = 0
    while waiting or running:
        running = [i for i in running if pos[i] < len(outputs[i])]
        while waiting and len(running) < limit:
            running.append(waiting.pop(0))
        sampled: list[list[int]] = []
        for slot, i in enumerate(running):
            out, draft = outputs[i], drafts.get(i, [])
            a = 0
            while a < len(draft) and pos[i] + a < len(out) and draft[a] == out[pos[i] + a]:
                a += 1
            if draft:
                n_drafts += 1
                accepted += a
            start, pos[i] = pos[i], min(pos[i] + a + 1, len(out))
            rows[slot, :n_prompt] = prompt
            rows[slot, n_prompt : n_prompt + pos[i]] = out[: pos[i]]
            sampled.append(list(out[start : pos[i]]))
        lengths = np.array([n_prompt + pos[i] for i in running])
        proposed = drafter.propose(sampled, lengths, rows[: len(running)])
        drafts = {i: (d if pos[i] < len(outputs[i]) else []) for i, d in zip(running, proposed, strict=True)}
    return ReplayStats(n_drafts, accepted, sum(len(o) for o in outputs))
