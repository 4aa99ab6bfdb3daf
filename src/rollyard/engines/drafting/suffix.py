"""A group's suffix index: next-token counts after every recent context, built incrementally.

It is a suffix trie cut at ``depth``: for each context of 1..``depth`` tokens that occurred in
any inserted sequence, how often each token followed it. Drafting walks it greedily: match the
longest suffix of the request's own tokens that occurred, take its most frequent continuation,
append, repeat, and stop when the chance that the whole draft is right (the product of the
continuations' empirical frequencies) falls below ``min_prob``. A full suffix tree would match
arbitrarily long suffixes; past a handful of tokens a longer match changes few drafts, and the
cut keeps an insertion at O(depth) dictionary updates.

Single path only: vLLM verifies one chain of draft tokens per request, so a second branch could
not be checked in the same step.

Memory is bounded: at most ``max_tokens`` tokens are ever inserted (later ones are ignored; the
index then drafts from what it has), and each inserted token adds at most ``depth`` entries.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class SuffixIndex:
    """Next-token counts after contexts of 1..depth tokens over a group's sequences."""

    def __init__(self, depth: int = 8, max_tokens: int = 65536, prior: float = 0.0) -> None:
        if depth < 1 or max_tokens < 0 or prior < 0:
            raise ValueError(
                f"depth must be >= 1, max_tokens and prior >= 0 (got {depth}, {max_tokens}, {prior})"
            )
        self.depth = depth
        self.max_tokens = max_tokens
        self.prior = prior  # pseudo-count of "something else" in scores: thin evidence is not certainty
        self.tokens = 0  # how many tokens were inserted
        self._next: dict[tuple[int, ...], dict[int, int]] = {}
        self._tails: dict[Hashable, list[int]] = {}

    @property
    def full(self) -> bool:
        return self.tokens >= self.max_tokens

    def entries(self) -> int:
        """Distinct contexts held: the index's size, which ``max_tokens`` bounds."""
        return len(self._next)

    def start(self, seq: Hashable, prefix: Sequence[int] = ()) -> None:
        """Begin sequence ``seq`` after ``prefix`` (its context, not counted as inserted)."""
        self._tails[seq] = [int(t) for t in prefix[-self.depth :]]

    def forget(self, seq: Hashable) -> None:
        """Drop a finished sequence's tail; its counts stay (siblings still draft from them)."""
        self._tails.pop(seq, None)

    def extend(self, seq: Hashable, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to ``seq`` (started on first use), counting each after its contexts."""
        tail = self._tails.setdefault(seq, [])
        for t in tokens:
            if self.tokens >= self.max_tokens:
                return
            t = int(t)
            for d in range(1, len(tail) + 1):
                counts = self._next.setdefault(tuple(tail[-d:]), {})
                counts[t] = counts.get(t, 0) + 1
            self.tokens += 1
            tail.append(t)
            if len(tail) > self.depth:
                del tail[0]

    def continuation(self, context: Sequence[int], min_match: int = 1) -> tuple[int, int, int, int] | None:
        """(token, its count, all counts, match length) for the longest matched suffix of
        ``context`` of at least ``min_match`` tokens, or None when none occurred."""
        for d in range(min(self.depth, len(context)), max(1, min_match) - 1, -1):
            counts = self._next.get(tuple(context[-d:]))
            if counts:
                token = max(counts, key=counts.__getitem__)  # ties: the first seen
                return token, counts[token], sum(counts.values()), d
        return None

    def draft(self, context: Sequence[int], k: int, min_match: int = 1, min_prob: float = 0.0) -> list[int]:
        """Up to ``k`` tokens continuing ``context``, greedily, while the whole draft's estimated
        chance of being right stays >= ``min_prob``."""
        return self.scored_draft(context, k, min_match, min_prob)[0]

    def scored_draft(
        self, context: Sequence[int], k: int, min_match: int = 1, min_prob: float = 0.0
    ) -> tuple[list[int], float]:
        """``draft`` and its score: the expected number of its tokens accepted (the sum over
        positions of the estimated chance that the draft is right up to there), so drafts from
        two indexes can be compared. ``min_prob`` bounds the chance as the counts say it; the
        prior discounts only the score: it ranks a draft seen once below one many siblings
        agree on without shortening either."""
        ctx = [int(t) for t in context[-self.depth :]]
        out: list[int] = []
        p = q = 1.0
        score = 0.0
        while len(out) < k:
            hit = self.continuation(ctx, min_match)
            if hit is None:
                break
            token, count, total, _ = hit
            p *= count / total
            if p < min_prob:
                break
            q *= count / (total + self.prior)
            out.append(token)
            score += q
            ctx.append(token)
            if len(ctx) > self.depth:
                del ctx[0]
        return out, score
