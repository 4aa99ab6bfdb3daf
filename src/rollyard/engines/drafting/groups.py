"""Which RL group a request belongs to, seen only through its tokens, and the groups' indexes.

vLLM hands a proposer token rows, not request ids or any metadata, so the group is read from
the prompt: a request joins the group of the first-seen prompt (the group's *root*) that is a
prefix of its own prompt, the longest such root when several are. The G samples of a GRPO group
send the same first-turn prompt, so they share a root; a later turn of the same program sends
that prompt plus its own history, which still starts with the root.

Failure modes, all harmless to correctness (drafts are only proposals; vLLM verifies them):
- Two groups with the same first prompt share one index: their samples answer the same
  question, so the shared statistics are as good as either group's own.
- A program whose history was rewritten (context management) no longer starts with its root:
  its prompt becomes a new root, so it drafts from its own tokens (per-request matching) and
  from any later request that starts with the rewritten prompt.
- A group whose first prompt extends an earlier group's root joins that group (shared index,
  harmless as above); when the longer root was seen first, the shorter prompt starts its own
  group and the longest matching root decides every later request.
Both tables are bounded: an LRU cap on roots and on groups, and groups idle past ``expire_s``
are dropped (the engine never hears that a program ended; idleness is the signal).
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np

from rollyard.engines.drafting.suffix import SuffixIndex


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


class GroupTable:
    """Prompt -> group id: the group of the longest known root that prefixes the prompt."""

    def __init__(self, max_roots: int = 4096) -> None:
        self.max_roots = max_roots
        self._roots: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._roots)

    def group_of(self, prompt: np.ndarray) -> tuple[int, bool]:
        """(group id, whether the prompt started a new group)."""
        prompt = np.asarray(prompt)
        n = len(prompt)
        for length in sorted((m for m in self._lengths if m <= n), reverse=True):
            key = (length, _digest(prompt[:length]))
            gid = self._roots.get(key)
            if gid is not None:
                self._roots.move_to_end(key)
                return gid, False
        return self.new_group(prompt), True

    def new_group(self, prompt: np.ndarray) -> int:
        """Register ``prompt`` as the root of a fresh group."""
        gid = self._next_id
        self._next_id += 1
        key = (len(prompt), _digest(np.asarray(prompt)))
        self._roots[key] = gid
        self._lengths[key[0]] += 1
        while len(self._roots) > self.max_roots:
            (length, _), _ = self._roots.popitem(last=False)
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]
        return gid


class GroupIndexes:
    """Each group's ``SuffixIndex``, dropped when idle past ``expire_s`` or beyond ``max_groups``."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        max_groups: int = 256,
        expire_s: float = 600.0,
        depth: int = 8,
        max_tokens: int = 65536,
        prior: float = 0.0,
    ) -> None:
        self.clock = clock
        self.max_groups = max_groups
        self.expire_s = expire_s
        self.depth = depth
        self.max_tokens = max_tokens
        self.prior = prior
        self._groups: OrderedDict[int, tuple[SuffixIndex, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, gid: int) -> bool:
        return gid in self._groups

    def peek(self, gid: int) -> SuffixIndex | None:
        """The group's index if it is held, without marking it used."""
        entry = self._groups.get(gid)
        return entry[0] if entry else None

    def get(self, gid: int) -> SuffixIndex:
        """The group's index (a fresh one if it is new or was dropped), marked as used now."""
        entry = self._groups.pop(gid, None)
        index = entry[0] if entry else SuffixIndex(self.depth, self.max_tokens, self.prior)
        self._groups[gid] = (index, self.clock())
        while len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)
        return index

    def sweep(self) -> int:
        """Drop groups idle for longer than ``expire_s``; returns how many went."""
        cutoff = self.clock() - self.expire_s
        dropped = 0
        while self._groups:
            gid, (_, used) = next(iter(self._groups.items()))
            if used >= cutoff:
                break
            del self._groups[gid]
            dropped += 1
        return dropped
