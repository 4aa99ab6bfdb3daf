"""KV blocks of one simulated engine, with a prefix cache that evicts least-recently-used.

As in vLLM, a finished (or preempted) request's full blocks stay in the cache, unreferenced
and evictable, until a new allocation needs room; a later request of the same program whose
prompt extends that history reuses them instead of recomputing. Agent histories only grow
(a rewrite would be a new program here), so a program's cached prefix is one count of blocks,
and eviction takes blocks from the tail of the least recently used program's prefix: the
same blocks vLLM would evict first, at a fraction of the bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BlockPool"]


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0  # blocks referenced by running requests
        self._cached: OrderedDict[str, int] = OrderedDict()  # program -> cached prefix blocks, LRU first
        self.cached = 0  # total evictable cached blocks
        self.evicted = 0

    @property
    def available(self) -> int:
        """Blocks an allocation may take (free plus evictable cached ones)."""
        return self.num_blocks - self.used

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: referenced blocks over all blocks."""
        return self.used / self.num_blocks

    def cached_for(self, program: str) -> int:
        return self._cached.get(program, 0)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def hit(self, program: str, prompt_tokens: int) -> int:
        """Take the program's cached prefix for a new prompt; returns the tokens it covers.

        The last prompt token is always computed (it yields the first output), so at most
        ``(prompt - 1) // block_size`` full blocks are reused; the rest of the entry is dropped
        from the cache (its blocks are about to be overwritten by this request's own)."""
        have = self._cached.pop(program, 0)
        if not have:
            return 0
        take = min(have, max(0, prompt_tokens - 1) // self.block_size)
        self.cached -= have
        self.used += take
        return take * self.block_size

    def allocate(self, n: int) -> bool:
        """Reference ``n`` more blocks, evicting cached ones LRU-first; False if they do not fit."""
        if n <= 0:
            return True
        if n > self.available:
            return False
        short = n - (self.num_blocks - self.used - self.cached)
        while short > 0:
            program, blocks = next(iter(self._cached.items()))
            drop = min(blocks, short)
            if drop == blocks:
                del self._cached[program]
            else:
                self._cached[program] = blocks - drop
            self.cached -= drop
            self.evicted += drop
            short -= drop
        self.used += n
        return True

    def release(self, program: str, held_blocks: int, computed_tokens: int) -> None:
        """A request let go of its blocks; its full ones stay cached as the program's prefix."""
        self.used -= held_blocks
        keep = min(held_blocks, computed_tokens // self.block_size)
        old = self._cached.pop(program, 0)
        if old > keep:  # an older, longer prefix of the same program (another request) wins
            keep = old
        self.cached += keep - old
        if keep:
            self._cached[program] = keep  # most recently used end

    def drop_all(self) -> None:
        """The engine died: nothing is referenced or cached any more."""
        self.used = 0
        self._cached.clear()
        self.cached = 0
