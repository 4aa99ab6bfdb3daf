"""One simulated inference engine: vLLM's continuous batching, chunked prefill, KV blocks,
prefix cache, and preemption with recompute, with step times from an ``EngineProfile``.

Each step follows vLLM v1's scheduler: running requests first (a decode token each, or the
next chunk of an unfinished prefill), within a token budget; a running request that cannot
get a new KV block preempts the most recently admitted running request (which frees all its
blocks and goes back to the front of the waiting queue, to be recomputed later: its prompt
and the tokens it had generated are prefilled again, from the prefix cache where the blocks
were not yet evicted); then, if nothing was preempted, waiting requests in order while the
blocks for their whole sequence fit (vLLM's ``scheduler_reserve_full_isl``, on by default:
a request is admitted only when its whole prompt, or on recompute its prompt and output so
far, fits the free blocks, though only the first chunk's blocks are taken at once). A
request of a GRPO group (``shared_key``) references its group's task-prompt blocks instead
of computing them when a member already has (``BlockPool.share``). Runs of
pure decode steps in which nothing can change (no request finishes, none needs a block that
is not there, none is waiting that could be admitted) are taken as one event of k steps; an
arrival cuts such a run short at the step under way, so the result is the same as stepping
one by one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rollyard.sim.kv import BlockPool, SharedPool
from rollyard.sim.profile import EngineProfile

__all__ = ["EngineRequest", "SimEngine"]

MAX_RUN = 256  # longest run of decode steps taken as one event (bounds KV-reading staleness)


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    program_id: str
    prompt_tokens: int
    max_tokens: int
    arrived: float
    target: int = 0  # tokens to compute before the next output token (prompt, or more on recompute)
    computed: int = 0  # tokens whose KV exists
    generated: int = 0
    blocks: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (all admissions)
    shared_key: str | None = None  # its group, whose task prompt every member's context starts with
    shared_tokens: int = 0  # that prompt's tokens
    shared: int = 0  # the group's blocks it references (apart from ``blocks``, its own)
    loaded_tokens: int = 0  # prompt tokens loaded from the shared KV pool (all admissions)

    def __post_init__(self) -> None:
        self.target = self.prompt_tokens


@dataclass
class _Run:
    """The step (or run of k decode steps) under way."""

    start: float
    end: float
    k: int  # decode steps in a run; 0 for a general step
    batch: list[tuple[EngineRequest, int]]  # general step: (request, tokens this step)
    n: int = 0
    attn0: int = 0  # sum of computed tokens over the run's requests at its start
    load_s: float = 0.0  # of a general step's time: loading contexts from the shared pool


class SimEngine:
    def __init__(self, name: str, profile: EngineProfile, pool: SharedPool | None = None) -> None:
        """``pool``: the KV pool shared with the other engines (None: each has its prefix cache only)."""
        self.name = name
        self.profile = profile
        self.pool = pool
        self.kv = BlockPool(profile.num_blocks, profile.block_size)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.run: _Run | None = None
        self.version = 0  # bumped when the run under way is replaced; stale step events are ignored
        self.healthy = True
        self.fenced = False  # taking new weights: no step starts until the fence lifts
        self.busy_s = 0.0
        self.steps = 0
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.output_tokens = 0
        self.prefill_done = 0  # prompt tokens computed (not from cache), as vLLM's prefill counters
        self.prefill_s = 0.0  # step time spent on them (a mixed step's time split by token share)
        self.loaded_tokens = 0  # prompt tokens loaded from the shared pool instead (not in prefill_done)
        self.load_s = 0.0  # step time spent loading them

    # ---- the driver's calls ----------------------------------------------------------------
    def add(self, request: EngineRequest, now: float) -> float | None:
        """Queue a request; returns the new end of a decode run it cut short (None: unchanged).

        An idle engine does not start here: the driver calls ``plan`` once every request
        that arrived at this instant is queued, so they share the first step, as in vLLM."""
        self.waiting.append(request)
        self.prompt_tokens += request.prompt_tokens
        if self.run is not None and self.run.k > 1:
            return self._cut(now)
        return None

    def plan(self, now: float) -> float | None:
        """Start the next step if there is work; returns when it ends."""
        if not self.healthy or self.fenced or (not self.running and not self.waiting):
            self.run = None
            return None
        run = self._decode_run(now) or self._general_step(now)
        self.run = run
        self.version += 1
        return run.end if run is not None else None

    def fence(self, now: float) -> float | None:
        """Stop scheduling for a weight swap: the step under way ends, no next one starts until
        ``fenced`` is cleared. Returns the new end of a decode run cut short (None: unchanged)."""
        self.fenced = True
        if self.run is not None and self.run.k > 1:
            return self._cut(now)
        return None

    def finish(self, now: float) -> list[EngineRequest]:
        """The step under way ended at ``now``: apply it; returns the requests that finished."""
        run = self.run
        assert run is not None
        self.busy_s += run.end - run.start
        done: list[EngineRequest] = []
        if run.k:
            self.steps += run.k
            self.output_tokens += run.k * len(self.running)
            for r in self.running:
                r.computed += run.k
                r.generated += run.k
                self._save(r)
                if r.generated >= r.max_tokens:
                    done.append(r)
        else:
            self.steps += 1
            pre = sum(n for r, n in run.batch if r.computed < r.target)
            if pre:
                self.prefill_done += pre
                self.prefill_s += (run.end - run.start - run.load_s) * pre / sum(n for _, n in run.batch)
            for r, ntok in run.batch:
                r.computed += ntok
                self._publish(r)
                self._save(r)
                if r.computed >= r.target:
                    r.generated += 1
                    self.output_tokens += 1
                    if r.first_token_at is None:
                        r.first_token_at = now
                    if r.generated >= r.max_tokens:
                        done.append(r)
        for r in done:
            r.finished_at = now
            self.running.remove(r)
            self._release(r)
        self.run = None
        return done

    # ---- the group's shared prefix ---------------------------------------------------------
    def _want(self, r: EngineRequest) -> int:
        """The group-prefix blocks a request can share (full blocks, never its last prompt token)."""
        if r.shared_key is None:
            return 0
        return min(r.shared_tokens, max(0, r.prompt_tokens - 1)) // self.kv.block_size

    def _publish(self, r: EngineRequest) -> None:
        """A member that computed the group prefix itself hands those blocks to the group."""
        want = self._want(r)
        if want and not r.shared and r.computed >= want * self.kv.block_size:
            assert r.shared_key is not None
            if self.kv.publish(r.shared_key, want):
                r.blocks -= want
                r.shared = want

    def _save(self, r: EngineRequest) -> None:
        """The shared pool stores the request's full blocks (as the connector does after each step)."""
        if self.pool is not None:
            self.pool.store(r.program_id, r.computed, r.shared_key, r.shared_tokens)

    def _pool_hit(self, r: EngineRequest, local: int) -> int:
        """Tokens of ``r``'s context beyond its local hit that load from the shared pool (full
        blocks, never its last prompt token)."""
        if self.pool is None:
            return 0
        limit = max(0, r.target - 1) // self.kv.block_size * self.kv.block_size
        return max(0, min(self.pool.stored(r.program_id, r.shared_key), limit) - local)

    def _release(self, r: EngineRequest) -> None:
        self.kv.release(r.program_id, r.blocks, r.computed, r.shared, self._want(r))
        if r.shared:
            assert r.shared_key is not None
            self.kv.unshare(r.shared_key)
        r.blocks = r.shared = 0

    def _first_hit(self, r: EngineRequest) -> int:
        """Admit ``r``'s cached prefix: the group's blocks, then its own entry behind them."""
        kv, want = self.kv, self._want(r)
        shared = kv.share(r.shared_key, want) if want else 0
        assert r.shared_key is not None or not shared
        own = kv.hit(r.program_id, r.target, want) if shared == want else 0
        r.shared, r.blocks = shared, own // kv.block_size
        return shared * kv.block_size + own

    def fail(self) -> list[EngineRequest]:
        """The engine died: every request on it is lost, and so is its cache."""
        lost = [*self.running, *self.waiting]
        self.running.clear()
        self.waiting.clear()
        self.kv.drop_all()
        self.run = None
        self.version += 1
        self.healthy = False
        return lost

    # ---- scheduling ------------------------------------------------------------------------
    def _decode_run(self, now: float) -> _Run | None:
        """k decode steps as one event, when nothing can change before they end."""
        if not self.running:
            return None
        for r in self.running:
            if r.computed < r.target:
                return None  # a chunked prefill is under way
        room = len(self.running) < self.profile.max_num_seqs
        if self.waiting and room and self._admissible(self.waiting[0]):
            return None
        n = len(self.running)
        if n >= self.profile.max_batched_tokens:
            return None
        k = min(MAX_RUN, min(r.max_tokens - r.generated for r in self.running))
        k = self._kv_steps(k)
        if k < 1:
            return None  # someone needs a block that is not there: a general step preempts
        attn0 = sum(r.computed for r in self.running)
        run = _Run(now, now, k, [], n, attn0)
        run.end = now + self._run_s(run, k)
        return run

    def _run_s(self, run: _Run, j: int) -> float:
        p, n = self.profile, run.n
        attn = j * run.attn0 + n * j * (j + 1) / 2
        return j * (p.overhead_s + p.per_token_s * n + p.per_seq_s * n) + p.decode_attn_s * attn

    def _kv_steps(self, k: int) -> int:
        """The most decode steps (<= k) whose new blocks fit."""
        bs, avail = self.kv.block_size, self.kv.available
        room = [(r.blocks + r.shared) * bs - r.computed for r in self.running]  # left in held blocks

        def need(j: int) -> int:
            return sum(-(-(j - o) // bs) for o in room if j > o)

        if need(k) <= avail:
            return k
        lo, hi = 0, k  # need(lo) fits, need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= avail else (lo, mid)
        return lo

    def _admissible(self, r: EngineRequest) -> bool:
        """Would the waiting head be admitted now: do the blocks for its whole sequence fit?"""
        kv, bs, want = self.kv, self.kv.block_size, self._want(r)
        have, in_use = kv.shared_blocks(r.shared_key) if r.shared_key is not None and want else (0, False)
        shared = min(have, want)
        own = min(kv.cached_for(r.program_id), max(0, (r.target - 1) // bs - want)) if shared == want else 0
        hit = shared + own
        taken = own + (0 if in_use else shared)  # cached blocks it would take out of the free pool
        return kv.blocks_for(r.target) - hit <= kv.available - taken

    def _cut(self, now: float) -> float | None:
        """Shorten the decode run under way to the step in progress at ``now``."""
        run = self.run
        assert run is not None
        lo, hi = 1, run.k  # the first j whose end is at or after now
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if run.start + self._run_s(run, mid) >= now else (mid + 1, hi)
        if lo >= run.k:
            return None
        run.k = lo
        run.end = run.start + self._run_s(run, lo)
        self.version += 1
        return run.end

    def _general_step(self, now: float) -> _Run | None:
        p, kv = self.profile, self.kv
        bs, budget = kv.block_size, p.max_batched_tokens
        batch: list[tuple[EngineRequest, int]] = []
        preempted = False
        load = 0  # tokens the requests admitted in this step load from the shared pool
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            ntok = min(r.target - r.computed, budget) if r.computed < r.target else 1
            need = -(-(r.computed + ntok) // bs) - r.blocks - r.shared
            gone = False
            while need > 0 and not gone and not kv.allocate(need):
                victim = self.running.pop()
                self._preempt(victim)
                preempted, gone = True, victim is r
            if gone:
                break  # it was the last one admitted: it preempted itself
            if need > 0:
                r.blocks += need
            batch.append((r, ntok))
            budget -= ntok
            i += 1
        while not preempted and self.waiting and len(self.running) < p.max_num_seqs and budget > 0:
            r = self.waiting[0]
            loaded = 0
            if r.computed == 0:
                hit = self._first_hit(r)
                loaded = self._pool_hit(r, hit)  # into fresh blocks, allocated with the computed ones
                r.computed = hit + loaded
                r.cached_tokens += hit
                self.hit_tokens += hit
            ntok = min(r.target - r.computed, budget)
            need = kv.blocks_for(r.computed + ntok) - r.blocks - r.shared
            whole = kv.blocks_for(r.target) - r.blocks - r.shared  # vLLM's full-sequence gate
            if whole > kv.available or not kv.allocate(need):
                self.hit_tokens -= r.computed - loaded  # the hit is given back with the blocks
                r.cached_tokens -= r.computed - loaded
                self._release(r)
                r.computed = 0
                break
            r.loaded_tokens += loaded
            load += loaded
            r.blocks += need
            self.waiting.popleft()
            self.running.append(r)
            batch.append((r, ntok))
            budget -= ntok
        if not batch:
            return None
        tokens = decode_ctx = pairs = 0.0
        for r, n in batch:
            tokens += n
            if r.computed < r.target:
                pairs += n * (r.computed + (n + 1) / 2)
            else:
                decode_ctx += r.computed + 1
        load_s = p.pool_load_s(load) if load else 0.0  # loaded before the forward pass, as the connector does
        self.loaded_tokens += load
        self.load_s += load_s
        end = now + p.step_s(int(tokens), len(batch), decode_ctx, pairs) + load_s
        return _Run(now, end, 0, batch, load_s=load_s)

    def _preempt(self, r: EngineRequest) -> None:
        """vLLM's recompute preemption: free every block, back to the front of the queue."""
        self._release(r)
        self.recomputed_tokens += r.computed
        self.preemptions += 1
        r.preemptions += 1
        r.computed = 0
        r.target = r.prompt_tokens + r.generated
        self.waiting.appendleft(r)
