"""The simulated KV pool (``rollyard sim --kv-pool``): a context another engine computed loads
at the profile's pool bandwidth instead of being prefilled, and the policies learn its rate."""

from __future__ import annotations

import pytest
from tests.sim.test_engine import drive

from rollyard.core.errors import ConfigError
from rollyard.sched.registry import policy_from_spec
from rollyard.sim import Simulation, load_profile, load_workload
from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.kv import SharedPool
from rollyard.sim.profile import EngineProfile


def profile(**kw: float) -> EngineProfile:
    base = dict(
        name="t", overhead_s=1.0, per_token_s=0.01, block_size=4, num_blocks=20, max_num_seqs=8,
        max_batched_tokens=64, max_model_len=64, kv_bytes_per_token=100, pool_bytes_per_s=1000.0,
    )  # fmt: skip
    base.update(kw)
    return EngineProfile.model_validate(base)


def test_the_pool_stores_full_blocks_and_a_groups_prompt_once_computed() -> None:
    pool = SharedPool(block_size=4)
    pool.store("p", 11, group="g", group_tokens=9)
    assert (pool.stored("p", "g"), pool.stored("q", "g"), pool.stored("q")) == (8, 8, 0)
    pool.store("p", 6)  # a shorter request never shrinks what is stored
    assert pool.stored("p") == 8


def test_a_context_computed_on_one_engine_loads_on_another_and_its_load_is_charged() -> None:
    prof = profile()
    pool = SharedPool(prof.block_size)
    a, b, plain = SimEngine("a", prof, pool), SimEngine("b", prof, pool), SimEngine("c", prof)
    drive(a, [(0.0, EngineRequest("t1", "p", 20, 3, 0.0))])  # p's context: 22 tokens, 20 in full blocks
    assert pool.stored("p") == 20 and a.loaded_tokens == 0
    moved = EngineRequest("t2", "p", 30, 1, 0.0)  # turn 2 on another engine
    end = drive(b, [(0.0, moved)])
    assert (moved.loaded_tokens, b.loaded_tokens, b.prefill_done) == (20, 20, 10)
    assert b.load_s == pytest.approx(20 * 100 / 1000.0)  # tokens x bytes per token / bandwidth
    again = EngineRequest("t2", "p", 30, 1, 0.0)
    base = drive(plain, [(0.0, again)])
    assert (again.loaded_tokens, plain.prefill_done) == (0, 30)
    # loading 20 tokens costs 2 s here, computing them 0.2 s: the pool is charged, not free
    assert end - base == pytest.approx(2.0 - 20 * 0.01)


def test_a_local_prefix_hit_is_not_loaded_again() -> None:
    prof = profile()
    pool = SharedPool(prof.block_size)
    a = SimEngine("a", prof, pool)
    drive(a, [(0.0, EngineRequest("t1", "p", 20, 3, 0.0))])
    second = EngineRequest("t2", "p", 30, 1, 0.0)
    drive(a, [(10.0, second)])
    assert (second.cached_tokens, second.loaded_tokens) == (20, 0)


def test_a_simulated_run_with_the_pool_loads_moved_contexts_instead_of_prefilling_them() -> None:
    w = load_workload("seer", programs=64, divide_tokens=1024)
    prof = load_profile("h100-llama8b").with_kv_tokens(40000)
    plain = Simulation(w, policy_from_spec("seer"), prof).run().summary
    rate = prof.pool_load_tok_s
    assert rate == pytest.approx(25e9 / (128 * 1024))
    pooled = Simulation(w, policy_from_spec("seer", pool_load_tok_s=rate), prof, kv_pool=True).run().summary
    assert plain["pool_loaded_tokens"] == 0 and pooled["pool_loaded_tokens"] > 0
    assert pooled["prefill_tokens"] < plain["prefill_tokens"]
    assert plain["moves"] > 0


def test_a_profile_without_pool_terms_refuses_the_pool() -> None:
    w = load_workload("seer", programs=8)
    prof = profile(kv_bytes_per_token=None, max_model_len=32768, num_blocks=10000)
    with pytest.raises(ConfigError, match="no KV pool terms"):
        Simulation(w, policy_from_spec("seer"), prof, kv_pool=True)
