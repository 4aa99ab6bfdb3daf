"""Follow requests across engine steps through their token rows alone.

vLLM moves requests between rows of its batch (a finished request's row is refilled, an
unscheduled request leaves the batch and comes back later), and the proposer is not told which
request a row holds. A row is recognised by a fingerprint of its tokens: its length and its
first and last ``span`` tokens. After a step a request's fingerprint is looked up at its old
length (its length minus the tokens just sampled), then stored at the new one. A row whose old
fingerprint is unknown is a new request; its prompt is everything but the tokens just sampled
(a request resumed after preemption therefore counts its earlier output as prompt).

Two requests with the same fingerprint have the same recent tokens; mixing them up only moves
a few counts between siblings' sequences of the same group.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Request:
    """One engine request as the drafter knows it."""

    seq: int  # this request's sequence id in its group's index
    prompt_len: int
    group: int = -1


class RowTracker:
    """Maps token rows to ``Request`` records, at most ``max_requests`` of them (LRU)."""

    def __init__(
        self, span: int = 16, max_requests: int = 4096, on_evict: Callable[[Request], None] | None = None
    ) -> None:
        self.span = span
        self.max_requests = max_requests
        self.on_evict = on_evict
        self._by_key: OrderedDict[tuple[int, bytes, bytes], list[Request]] = OrderedDict()
        self._count = 0
        self._next_seq = 0

    def __len__(self) -> int:
        return self._count

    def _key(self, row: np.ndarray, n: int) -> tuple[int, bytes, bytes]:
        return (n, row[: min(n, self.span)].tobytes(), row[max(0, n - self.span) : n].tobytes())

    def observe(self, row: np.ndarray, n: int, new_tokens: int) -> tuple[Request, bool]:
        """The request in ``row`` (``n`` tokens, the last ``new_tokens`` just sampled) and
        whether it is new; it is re-filed under its new fingerprint."""
        old = self._key(row, n - new_tokens)
        found = self._by_key.get(old)
        if found:
            req, is_new = found.pop(), False
            if not found:
                del self._by_key[old]
            self._count -= 1
        else:
            req, is_new = Request(seq=self._next_seq, prompt_len=n - new_tokens), True
            self._next_seq += 1
        key = self._key(row, n)
        self._by_key.setdefault(key, []).append(req)
        self._by_key.move_to_end(key)
        self._count += 1
        while self._count > self.max_requests:
            _, reqs = self._by_key.popitem(last=False)
            self._count -= len(reqs)
            for r in reqs:
                if self.on_evict is not None:
                    self.on_evict(r)
        return req, is_new
