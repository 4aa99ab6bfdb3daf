"""KV blocks of one simulated engine, with a prefix cache that evicts least-recently-used.

As in vLLM, a finished (or preempted) request's full blocks stay in the cache, unreferenced
and evictable, until a new allocation needs room; a later request of the same program whose
prompt extends that history reuses them instead of recomputing. Agent histories only grow
(a rewrite would be a new program here), so a program's cached prefix is one count of blocks,
and eviction takes blocks from the tail of the least recently used program's prefix: the
same blocks vLLM would evict first, at a fraction of the bookkeeping.

A GRPO group's programs start from the same task prompt, so their first full blocks are the
same content and vLLM's hashed prefix cache stores them once: a member admitted while another
references them (or while they are cached) computes none of them and takes no new blocks.
Those blocks belong to the group (``share`` / ``publish`` / ``unshare``, counted once in
``used`` while any member references them, then cached under the group like a program's
prefix); a program's own entry holds only the blocks after them, and is usable only behind the
whole shared prefix (vLLM's chained block hashes).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BlockPool", "SharedPool"]


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0  # blocks referenced by running requests
        # program (or _group(key)) -> cached prefix blocks, LRU first
        self._cached: OrderedDict[str, int] = OrderedDict()
        self._groups: dict[str, list[int]] = {}  # group key -> [shared blocks, requests referencing]
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

    def hit(self, program: str, prompt_tokens: int, skip_blocks: int = 0) -> int:
        """Take the program's cached prefix for a new prompt; returns the tokens it covers.

        ``skip_blocks``: the group's shared blocks in front of it (the entry starts after them).
        The last prompt token is always computed (it yields the first output), so at most
        ``(prompt - 1) // block_size`` full blocks are reused; the rest of the entry is dropped
        from the cache (its blocks are about to be overwritten by this request's own)."""
        return (
            self._take(program, max(0, prompt_tokens - 1) // self.block_size - skip_blocks) * self.block_size
        )

    def shared_blocks(self, key: str) -> tuple[int, bool]:
        """(blocks of the group's prefix there are, whether they are referenced now)."""
        g = self._groups.get(key)
        return (g[0], True) if g is not None else (self._cached.get(_group(key), 0), False)

    def share(self, key: str, want: int) -> int:
        """Reference the group's computed prefix (at most ``want`` blocks) for a request being
        admitted; returns the blocks it covers (0: none there, the request computes its own)."""
        g = self._groups.get(key)
        if g is not None:
            g[1] += 1
            return min(g[0], want)
        take = self._take(_group(key), want)
        if take:
            self._groups[key] = [take, 1]
        return take

    def publish(self, key: str, blocks: int) -> bool:
        """A request computed the group's prefix in its own blocks: they become the group's (for
        later members) if the group has none referenced yet; False: it keeps them as its own."""
        if key in self._groups:
            return False
        self._groups[key] = [blocks, 1]
        return True

    def unshare(self, key: str) -> None:
        """A request let go of the group's blocks; the last one leaves them cached."""
        g = self._groups[key]
        g[1] -= 1
        if g[1] > 0:
            return
        del self._groups[key]
        self.used -= g[0]
        self._keep(_group(key), g[0])

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

    def release(
        self, program: str, held_blocks: int, computed_tokens: int, own_from: int = 0, entry_from: int = 0
    ) -> None:
        """A request let go of its own blocks; its full ones stay cached as the program's prefix.

        Its own blocks start at position ``own_from`` (after the group's blocks it referenced);
        the program's entry starts at ``entry_from`` (after the whole group prefix): own blocks
        in between are freed, not kept."""
        self.used -= held_blocks
        skip = max(0, entry_from - own_from)
        self._keep(program, max(0, min(held_blocks - skip, computed_tokens // self.block_size - entry_from)))

    def _take(self, name: str, limit: int) -> int:
        """Pop a cache entry and reference up to ``limit`` of its blocks (the rest are dropped:
        about to be overwritten); returns the blocks taken."""
        have = self._cached.pop(name, 0)
        take = max(0, min(have, limit))
        self.cached -= have
        self.used += take
        return take

    def _keep(self, name: str, blocks: int) -> None:
        """Cache ``blocks`` under ``name`` at the most recently used end; an older, longer entry
        of the same name (another request's) wins."""
        old = self._cached.pop(name, 0)
        keep = max(old, blocks)
        self.cached += keep - old
        if keep:
            self._cached[name] = keep

    def drop_all(self) -> None:
        """The engine died: nothing is referenced or cached any more."""
        self.used = 0
        self._cached.clear()
        self._groups.clear()
        self.cached = 0


def _group(key: str) -> str:
    """A group's cache entry name (apart from program ids, which never start with NUL)."""
    return "\0" + key


class SharedPool:
    """The KV pool the engines share (``rollyard sim --kv-pool``, ``engine.kv_pool`` live): every
    full block an engine computes is stored (ours and Mooncake's connector save generated tokens'
    blocks too), keyed by its prefix, so a program's stored context is one count of tokens, and a
    group's task prompt is stored once any member computed it. An engine admitting a request loads
    the stored tokens beyond its own prefix-cache hit instead of prefilling them. The pool's
    capacity is not modelled (Mooncake's segments are sized for a run's contexts)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._programs: dict[str, int] = {}
        self._groups: dict[str, int] = {}

    def store(self, program: str, computed: int, group: str | None = None, group_tokens: int = 0) -> None:
        """A request of ``program`` has ``computed`` tokens of KV: its full blocks are stored."""
        full = computed // self.block_size * self.block_size
        if full > self._programs.get(program, 0):
            self._programs[program] = full
        if group is not None and computed >= group_tokens and group not in self._groups:
            self._groups[group] = group_tokens // self.block_size * self.block_size

    def stored(self, program: str, group: str | None = None) -> int:
        """Tokens of the program's context the pool holds (its own, or at least its group's prompt)."""
        own = self._programs.get(program, 0)
        return max(own, self._groups.get(group, 0)) if group is not None else own
