"""A shared KV pool in the cost-aware decisions: moves and restores off a program's engine are
charged a load from the pool (``pool_load_tok_s``) instead of a re-prefill, under a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.errors import ConfigError
from rollyard.engines.kvpool.config import LOAD_BYTES_PER_S, KVPoolConfig, kv_bytes_per_token
from rollyard.rollout.config import Config
from rollyard.rollout.gateway_proc import pool_options
from rollyard.sched import Move, Pause, Restore, Scheduler, make_policy
from rollyard.sched.pool import RebuildCost
from rollyard.sched.views import EngineView


def sched(policy: str, **options: object) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    s = Scheduler(clock, make_policy(policy, buffer_tokens=0, **options))
    for name in ("a", "b"):
        s.add_engine(name, capacity=4, kv_capacity_tokens=1000)
    return s, clock


def turn(s: Scheduler, rid: str, pid: str, prompt: int) -> None:
    s.submit(rid, pid, prompt)
    assert [d.request_id for d in s.dispatch()] == [rid]
    s.complete(rid, 10)


def paused_on_a_queued_engine(policy: str, **options: object) -> tuple[Scheduler, FakeClock]:
    """p (700 tokens) is paused on a, whose engine has 8 requests waiting (2 s each); b is idle."""
    s, clock = sched(policy, **options)
    turn(s, "r0", "p", 500)
    turn(s, "r1", "q", 100)
    assert (s.state.programs["p"].engine, s.state.programs["q"].engine) == ("a", "b")
    s.observe("p", context_tokens=1100)
    assert s.tick() == [Pause("p", "a")]
    s.observe("p", context_tokens=700)
    for e in ("a", "b"):
        s.state.engines[e].service_s = 2.0
    s.update_engine("a", waiting=8)
    clock.advance(1)
    return s, clock


@pytest.mark.parametrize("policy", ["rollyard", "thunder"])
def test_with_a_pool_a_restore_leaves_a_queued_engine_and_is_charged_the_load(policy: str) -> None:
    s, _ = paused_on_a_queued_engine(policy)
    assert s.tick() == [Restore("p", "a", 1.0)]  # no pool: its own engine (rollyard), most room (thunder)
    s, _ = paused_on_a_queued_engine(policy, pool_load_tok_s=10_000)  # 0.07 s load < 16 s queue
    assert s.tick() == [Restore("p", "b", 1.0, pooled=True)]
    s, _ = paused_on_a_queued_engine(policy, pool_load_tok_s=20)  # 35 s load > 16 s queue: stays
    assert s.tick() == [Restore("p", "a", 1.0)]


def test_with_a_pool_an_unqueued_restore_stays_where_its_prefix_is_cached() -> None:
    s, clock = sched("thunder", pool_load_tok_s=10_000)
    turn(s, "r0", "p", 400)
    turn(s, "r1", "q", 100)
    s.observe("p", context_tokens=1100)
    assert s.tick() == [Pause("p", "a")]
    s.observe("p", context_tokens=500)
    s.observe("q", context_tokens=0)  # b now has as much room, and wins thunder's tie on the name
    clock.advance(5)
    assert s.tick() == [Restore("p", "a", 5.0)]  # its own engine costs no load


def test_without_a_pool_thunder_restores_where_the_most_room_is() -> None:
    s, clock = sched("thunder")
    turn(s, "r0", "p", 400)
    turn(s, "r1", "q", 100)
    s.observe("p", context_tokens=1100)
    assert s.tick() == [Pause("p", "a")]
    s.observe("p", context_tokens=500)
    s.observe("q", context_tokens=0)
    clock.advance(5)
    assert s.tick() == [Restore("p", "b", 5.0)]  # re-prefilled there, and not marked pooled


def two_engines(**options: object) -> Scheduler:
    """Program p (2000 tokens) is sticky on a, whose engine queue is 8 x 2 s; b is idle."""
    s, clock = sched("rollyard", **options)
    for e in ("a", "b"):
        s.state.engines[e].kv_capacity_tokens = 100_000
    turn(s, "r0", "p", 2000)
    s.submit("r1", "q", 10)
    assert s.dispatch()[0].engine == "b"
    clock.advance(2.0)
    s.complete("r1", 10)
    s.forget("q")
    for e in ("a", "b"):
        s.state.engines[e].service_s = 2.0
    s.update_engine("a", waiting=8)
    s.update_engine("b", prefill_tok_s=50.0)  # re-prefill 40 s > 16 s queue
    return s


def test_a_move_that_re_prefill_forbids_pays_with_a_pool_load() -> None:
    s = two_engines()
    s.submit("r2", "p", 2000)
    assert [type(d).__name__ for d in s.dispatch()] == ["Start"]
    s = two_engines(pool_load_tok_s=10_000)  # 0.2 s load
    s.submit("r2", "p", 2000)
    out = s.dispatch()
    assert isinstance(out[0], Move) and (out[0].dst, out[0].pooled) == ("b", True)
    assert "pool load 0.20s" in out[0].reason and out[1].moved_from == "a"


def test_a_pool_needs_no_measured_prefill_rate_to_move() -> None:
    s = two_engines(pool_load_tok_s=10_000)
    s.state.engines["b"].prefill_tok_s = 0.0
    s.submit("r2", "p", 2000)
    assert s.dispatch()[0].dst == "b"  # type: ignore[union-attr]


def test_the_seer_router_charges_the_same_cost() -> None:
    router = make_policy("seer", pool_load_tok_s=4000).router
    assert router.rebuild == RebuildCost(2000.0, 4000.0)
    e = EngineView("b", prefill_tok_s=1000.0)
    assert RebuildCost(2000.0, 4000.0).seconds(2000, e) == 0.5
    assert RebuildCost(2000.0, 0.0).seconds(2000, e) == 2.0
    with pytest.raises(ConfigError, match="pool_load_tok_s"):
        make_policy("rollyard", pool_load_tok_s=-1)


def test_the_pool_rate_comes_from_the_pools_kind_and_the_models_kv_size(tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_size": 256, "torch_dtype": "float32"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes_per_token(tmp_path) == 4096  # the tiny model: 256 KiB per 64-token block
    assert KVPoolConfig().load_tok_s(4096) == 0.0
    assert KVPoolConfig(kind="local").load_tok_s(4096) == LOAD_BYTES_PER_S["local"] / 4096
    assert KVPoolConfig(kind="local", load_bytes_per_s=4096e3).load_tok_s(4096) == 1000.0
    run = Config.model_validate({"model": {"path": "m"}, "engine": {"kv_pool": {"kind": "local"}}})
    assert pool_options(run, tmp_path) == {"pool_load_tok_s": round(LOAD_BYTES_PER_S["local"] / 4096, 1)}
    assert pool_options(Config.model_validate({"model": {"path": "m"}}), tmp_path) == {}
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="KV size"):
        kv_bytes_per_token(tmp_path)
