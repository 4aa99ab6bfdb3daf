"""The simulated engine: vLLM's recompute preemption on a hand-worked case, prefix reuse,
and runs of decode steps that give the same times as stepping one by one."""

from __future__ import annotations

import random

import pytest

from rollyard.sim import engine as engine_mod
from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.kv import BlockPool
from rollyard.sim.profile import EngineProfile


def profile(**kw: float) -> EngineProfile:
    base = dict(
        name="t", overhead_s=1.0, per_token_s=0.0, block_size=4, num_blocks=5,
        max_num_seqs=8, max_batched_tokens=64, max_model_len=16,
    )  # fmt: skip
    base.update(kw)
    return EngineProfile.model_validate(base)


def drive(engine: SimEngine, arrivals: list[tuple[float, EngineRequest]]) -> float:
    """Run the engine alone until idle, adding requests at their times; returns the end time."""
    now, pending = 0.0, sorted(arrivals, key=lambda a: a[0])
    end = None
    while pending or end is not None:
        if pending and (end is None or pending[0][0] < end):
            now = pending[0][0]
            while pending and pending[0][0] == now:  # simultaneous arrivals share a step
                new = engine.add(pending.pop(0)[1], now)
                end = new if new is not None else end
            if engine.run is None:
                end = engine.plan(now)
            continue
        assert end is not None
        now = end
        engine.finish(now)
        end = engine.plan(now)
    return now


def test_the_last_admitted_request_is_preempted_and_recomputed_from_the_prefix_cache() -> None:
    # 5 blocks of 4 tokens, every step 1 s. A and B: 7-token prompts, 6 output tokens each.
    # t0-1 prefill both (2 blocks each, 1 free); t1-2 decode (tokens 8 fit the held blocks);
    # t2-3 both need a 3rd block, one is free: A takes it, B (admitted last) is preempted,
    # its 2 full blocks stay cached; t3-6 A decodes alone and finishes (B cannot come back:
    # its 9-token recompute needs a block beyond its cached 2); t6-7 B re-prefills 1 token
    # on top of its 8 cached ones (evicting one of A's cached blocks); t7-10 B decodes.
    e = SimEngine("e", profile())
    a = EngineRequest("a", "pa", 7, 6, 0.0)
    b = EngineRequest("b", "pb", 7, 6, 0.0)
    assert drive(e, [(0.0, a), (0.0, b)]) == 10.0
    assert (a.finished_at, b.finished_at) == (6.0, 10.0)
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert e.preemptions == 1 and e.recomputed_tokens == 8
    assert b.cached_tokens == 8 and e.hit_tokens == 8
    assert e.kv.evicted == 1
    assert a.generated == b.generated == 6
    assert (a.first_token_at, b.first_token_at) == (1.0, 1.0)


def test_a_waiting_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    # vLLM's full-sequence admission gate (scheduler_reserve_full_isl, on by default). 5 blocks
    # of 4 tokens, 8 tokens a step, every step 1 s. A: 8-token prompt, 4 outputs; B: 12-token
    # prompt, 1 output. t0-1 A prefills (2 blocks); at t1 A's 9th token takes a 3rd block, 2
    # are free: B's first chunk (7 tokens, 2 blocks) would fit, its whole prompt (3) does not,
    # so B waits (admitting the chunk would preempt B at t2, its 12th token finding no block).
    # t1-4 A decodes alone and ends; t4-5 B prefills 8 tokens, t5-6 the last 4 and its token.
    e = SimEngine("e", profile(max_batched_tokens=8))
    a = EngineRequest("a", "pa", 8, 4, 0.0)
    b = EngineRequest("b", "pb", 12, 1, 0.0)
    assert drive(e, [(0.0, a), (0.0, b)]) == 6.0
    assert (a.finished_at, b.first_token_at, b.finished_at) == (4.0, 6.0, 6.0)
    assert e.preemptions == 0 and e.recomputed_tokens == 0


def test_a_later_turn_reuses_its_programs_cached_prefix() -> None:
    e = SimEngine("e", profile(num_blocks=20))
    first = EngineRequest("t1", "p", 10, 3, 0.0)
    drive(e, [(0.0, first)])
    second = EngineRequest("t2", "p", 14, 2, 10.0)  # the first turn's 12 tokens plus a tool result
    drive(e, [(10.0, second)])
    assert second.cached_tokens == 12  # 3 full blocks of the first turn's 12 computed tokens


def test_lru_eviction_takes_the_least_recently_used_programs_tail() -> None:
    kv = BlockPool(num_blocks=6, block_size=4)
    assert kv.allocate(3) and kv.allocate(3)
    kv.release("old", 3, 12)
    kv.release("new", 3, 12)
    assert kv.allocate(2)  # evicts from "old" first
    assert (kv.cached_for("old"), kv.cached_for("new"), kv.evicted) == (1, 3, 2)


def test_an_arrival_cuts_a_decode_run_at_the_step_under_way() -> None:
    e = SimEngine("e", profile(num_blocks=40))
    long = EngineRequest("a", "pa", 4, 12, 0.0)
    late = EngineRequest("b", "pb", 4, 2, 2.5)
    drive(e, [(0.0, long), (2.5, late)])
    assert late.first_token_at == 4.0  # admitted when the step running at 2.5 ended, at 3.0
    assert long.finished_at == 12.0


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_runs_of_decode_steps_time_like_single_steps(
    seed: int, grouped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    prof = profile(
        overhead_s=0.01, per_token_s=1e-4, decode_attn_s=1e-6, prefill_attn_s=1e-7,
        num_blocks=60, max_model_len=200, max_batched_tokens=48,
    )  # fmt: skip
    specs = [(rng.uniform(0, 3), rng.randint(5, 120), rng.randint(1, 60)) for _ in range(24)]

    def once() -> list[tuple[float | None, float | None, int]]:
        reqs = [EngineRequest(f"r{i}", f"p{i % 5}", n, m, t) for i, (t, n, m) in enumerate(specs)]
        if grouped:  # two groups sharing a 12-token task prompt
            for r in reqs:
                r.shared_key, r.shared_tokens = f"g{int(r.program_id[1:]) % 2}", 12
        e = SimEngine("e", prof)
        drive(e, [(r.arrived, r) for r in reqs])
        assert e.kv.used == 0  # every block and group reference given back
        return [(r.first_token_at, r.finished_at, r.preemptions) for r in reqs]

    batched = once()
    monkeypatch.setattr(engine_mod, "MAX_RUN", 1)
    stepped = once()
    assert any(p for *_, p in batched)  # the case does preempt
    for (f1, e1, p1), (f2, e2, p2) in zip(batched, stepped, strict=True):
        assert p1 == p2
        assert f1 == pytest.approx(f2, abs=1e-9) and e1 == pytest.approx(e2, abs=1e-9)


def member(rid: str, pid: str, prompt: int, out: int, at: float, shared: int = 9) -> EngineRequest:
    """A request of group ``g`` whose context starts with the group's ``shared``-token task prompt."""
    r = EngineRequest(rid, pid, prompt, out, at)
    r.shared_key, r.shared_tokens = "g", shared
    return r


def test_a_group_member_references_the_task_prompt_blocks_another_member_computed() -> None:
    # 4-token blocks, a 9-token task prompt: 2 full blocks the group shares. a computes them and
    # publishes them; b, admitted while a runs, takes them without computing or allocating them.
    e = SimEngine("e", profile(num_blocks=20))
    a, b = member("a", "pa", 11, 3, 0.0), member("b", "pb", 11, 3, 1.5)
    drive(e, [(0.0, a), (1.5, b)])
    assert (a.cached_tokens, b.cached_tokens) == (0, 8)
    assert e.prefill_done == 11 + 3
    assert e.kv.used == 0  # every reference and block given back
    assert e.kv.shared_blocks("g") == (2, False)  # cached for the group's later members
    later = member("c", "pc", 11, 1, 20.0)
    drive(e, [(20.0, later)])
    assert later.cached_tokens == 8


def test_shared_blocks_count_once_so_more_members_fit_than_private_copies_would() -> None:
    # 8 blocks: four members of 11 prompt tokens + 1 output need 3 blocks each privately (12 in
    # all, so some would wait); sharing 2 blocks, they need 2 + 4 x 1 = 6 and run together.
    e = SimEngine("e", profile(num_blocks=8))
    first = member("m0", "p0", 11, 1, 0.0)
    rest = [member(f"m{i}", f"p{i}", 11, 1, 1.0) for i in range(1, 4)]
    drive(e, [(0.0, first), *((1.0, r) for r in rest)])
    assert {r.first_token_at for r in rest} == {2.0}  # all admitted in one step
    assert e.preemptions == 0 and e.kv.used == 0


def test_a_members_own_prefix_is_reused_behind_the_group_blocks_on_its_next_turn() -> None:
    e = SimEngine("e", profile(num_blocks=20))
    t1 = member("t1", "p", 11, 5, 0.0)
    drive(e, [(0.0, t1)])
    t2 = member("t2", "p", 18, 2, 10.0)  # its 15 computed tokens plus a tool result
    drive(e, [(10.0, t2)])
    assert t2.cached_tokens == 12  # 2 group blocks + its own 1 full block behind them
    assert e.kv.cached_for("p") == 19 // 4 - 2  # its entry never holds the group's blocks
    assert e.kv.used == 0
