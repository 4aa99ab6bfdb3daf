"""The vLLM proposer: grouped suffix drafting inside the engine's model runner.

vLLM 0.32 loads it with ``--speculative-config '{"method": "custom_class", "model":
"rollyard.engines.drafting.GroupedSuffixDrafter", "num_speculative_tokens": K}'``, constructs it
with the engine's ``VllmConfig``, calls ``load_model(model)`` once and, after every step's
bookkeeping, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)``: per batch
row, the tokens just accepted, the row's length and the row's tokens. It returns one draft per
row (an empty one: no speculation for that row); vLLM verifies the drafts with the target model,
so the output distribution is unchanged whatever is drafted.

It runs inside the engine process: it imports only numpy and the standard library. Its knobs
come from the environment the launcher sets (``ROLLYARD_DRAFT_*``, see ``DrafterSettings``).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rollyard.engines.drafting.groups import GroupIndexes, GroupTable
from rollyard.engines.drafting.rows import Request, RowTracker
from rollyard.engines.drafting.suffix import SuffixIndex

ENV_PREFIX = "ROLLYARD_DRAFT_"
PROMPT_TOKENS_INDEXED = 4096  # a root prompt's last tokens go into its group's index


@dataclass(frozen=True)
class DrafterSettings:
    """The drafter's knobs; each may be set as ``ROLLYARD_DRAFT_<NAME>`` in the engine's env.

    ``budget``: draft tokens per engine step over the whole batch, so drafts shorten as the
    batch fills (speculation is wasted compute on a saturated engine) and stop past ``budget``
    running requests. ``min_match`` / ``min_prob``: draft only after a matched suffix of at least
    this many tokens and while the draft's estimated chance of being right stays above this;
    ``group_min_match``: the longer match a draft from the group's index needs (a sibling's
    text is weaker evidence than the request's own: on SmolLM2 samples at T = 0.7 replayed offline, 4 instead
    of 2 raised grouped acceptance from 1.98 to 2.13 tokens per draft, the share of tokens
    taken from drafts falling from 28% to 22%). ``prior``: a pseudo-count of "something else"
    added to every context's counts when a draft is scored (not when it is drafted), so a
    continuation seen once scores 1/2, not certainty. With 0, a single sighting in the request's
    own prompt or history tied or beat the consensus of 15 siblings: replaying the reading
    demo's SFT'd samples (G = 16, T = 1, 4 at a time), the own draft won 503 of 679 contests
    and was right for 39% of its tokens against 90% for the group's; with 1 the group's draft
    wins 442 of 502 and grouped acceptance rises from 3.26 to 4.04 (``docs/drafting.md``)."""

    budget: int = 64
    min_match: int = 2
    group_min_match: int = 4  # a sibling's text is weaker evidence than the request's own
    min_prob: float = 0.1
    depth: int = 8
    max_tokens: int = 65536  # per group
    max_groups: int = 256
    expire_s: float = 600.0
    prior: float = 1.0  # pseudo-count that discounts continuations seen only a few times
    own_tokens: int = 8192  # per request (its own index)
    max_requests: int = 512  # requests whose own index is held (LRU)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> DrafterSettings:
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = float(raw) if f.type == "float" else int(raw)
        return cls(**values)

    def draft_len(self, k_max: int, running: int) -> int:
        """Tokens to draft per request when ``running`` requests decode in this step."""
        return max(0, min(k_max, self.budget // max(1, running)))


class GroupedSuffixDrafter:
    """Drafts each request's next tokens from its RL group's suffix index (all siblings' output)
    or from its own index (its prompt and output), whichever draft promises more accepted tokens.

    The own index matters because counts pooled over a group dilute what one request keeps
    repeating (a loop of its own, a name it chose): measured on real samples, drafting from the
    group index alone accepted less than drafting from each request's own tokens."""

    grouped = True

    def __init__(
        self,
        vllm_config: Any,
        settings: DrafterSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        spec = vllm_config.speculative_config
        self.k_max = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = settings or DrafterSettings.from_env()
        s = self.settings
        self.table = GroupTable()
        self.indexes = GroupIndexes(
            clock,
            max_groups=s.max_groups,
            expire_s=s.expire_s,
            depth=s.depth,
            max_tokens=s.max_tokens,
            prior=s.prior,
        )
        self.own: OrderedDict[int, SuffixIndex] = OrderedDict()
        self.rows = RowTracker(on_evict=self._forget)
        self.steps = 0
        self.picked = {"own": 0, "group": 0}  # which index each non-empty draft came from

    def load_model(self, *args: object, **kwargs: object) -> None:
        """The CPU runner calls this with the target model; there is no draft model to load."""

    def _forget(self, req: Request) -> None:
        self.own.pop(req.seq, None)
        index = self.indexes.peek(req.group)
        if index is not None:
            index.forget(req.seq)

    def _own_index(self, req: Request, before: np.ndarray) -> SuffixIndex:
        """The request's own index, (re)built from ``before`` (its tokens before this step's)
        when it is new or was dropped from the LRU."""
        index = self.own.pop(req.seq, None)
        if index is None:
            index = SuffixIndex(self.settings.depth, self.settings.own_tokens, self.settings.prior)
            index.extend(req.seq, before[-PROMPT_TOKENS_INDEXED:].tolist())
        self.own[req.seq] = index
        while len(self.own) > self.settings.max_requests:
            self.own.popitem(last=False)
        return index

    def _join(self, req: Request, row: np.ndarray) -> None:
        """Give a new request its group; a new group's index starts with the root prompt."""
        prompt = row[: req.prompt_len]
        req.group, fresh = self.table.group_of(prompt)
        index = self.indexes.get(req.group)
        if fresh or index.tokens == 0:  # new, or dropped and recreated
            root = ("root", req.seq)
            index.start(root)
            index.extend(root, prompt[-PROMPT_TOKENS_INDEXED:].tolist())
            index.forget(root)
        index.start(req.seq, prompt[-index.depth :].tolist())

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        *args: object,
        **kwargs: object,
    ) -> list[list[int]]:
        """One draft per row: record the row's new tokens, then draft from the better index."""
        self.steps += 1
        if self.steps % 256 == 0:
            self.indexes.sweep()
        running = sum(1 for s in sampled_token_ids if len(s))
        k = self.settings.draft_len(self.k_max, running)
        s = self.settings
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled):
                drafts.append([])
                continue
            n = int(num_tokens_no_spec[i])
            row = token_ids_cpu[i]
            new_tokens = row[n - len(sampled) : n].tolist()
            req, new = self.rows.observe(row, n, len(sampled))
            if new and self.grouped:
                self._join(req, row)
            own = self._own_index(req, row[: n - len(sampled)])
            own.extend(req.seq, new_tokens)
            group = self.indexes.get(req.group) if self.grouped else None
            if group is not None:
                group.extend(req.seq, new_tokens)
            room = min(k, self.max_model_len - n - 1)
            if room <= 0:
                drafts.append([])
                continue
            context = row[max(0, n - s.depth) : n].tolist()
            best, where = own.scored_draft(context, room, s.min_match, s.min_prob), "own"
            if group is not None:
                pooled = group.scored_draft(context, room, s.group_min_match, s.min_prob)
                if pooled[1] > best[1]:
                    best, where = pooled, "group"
            if best[0]:
                self.picked[where] += 1
            drafts.append(best[0])
        return drafts


class SoloSuffixDrafter(GroupedSuffixDrafter):
    """The same drafter with no group: each request drafts from its own prompt and output only
    (the benchmark's per-request baseline)."""

    grouped = False
