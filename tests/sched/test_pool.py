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


TINY = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256}


def test_the_pool_rate_comes_from_the_pools_kind_and_the_models_kv_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "torch_dtype": "bfloat16"}))
    # the engine's dtype, not the checkpoint's: float32 on CPU (256 KiB per 64-token block)
    assert kv_bytes_per_token(tmp_path, "float32") == 4096
    assert kv_bytes_per_token(tmp_path, "bfloat16") == 2048
    assert KVPoolConfig().load_tok_s(4096) == 0.0
    assert KVPoolConfig(kind="local").load_tok_s(4096) == LOAD_BYTES_PER_S["local"] / 4096
    assert KVPoolConfig(kind="local", load_bytes_per_s=4096e3).load_tok_s(4096) == 1000.0
    with pytest.raises(ConfigError, match="dtype 'int3'"):
        kv_bytes_per_token(tmp_path, "int3")


def test_a_multimodal_configs_sizes_are_read_from_its_text_config(tmp_path: Path) -> None:
    vision = {"num_hidden_layers": 32, "num_attention_heads": 16, "hidden_size": 1280}
    cfg = {"vision_config": vision, "text_config": TINY, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes_per_token(tmp_path, "float32") == 4096


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_runs_pool_rate_uses_the_engines_serving_dtype(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "torch_dtype": "float16"}))
    monkeypatch.setattr("rollyard.rollout.gateway_proc.serving_dtype", lambda: dtype)
    run = Config.model_validate({"model": {"path": "m"}, "engine": {"kv_pool": {"kind": "local"}}})
    size = {"float32": 4096, "bfloat16": 2048}[dtype]
    assert pool_options(run, tmp_path) == {"pool_load_tok_s": round(LOAD_BYTES_PER_S["local"] / size, 1)}
    assert pool_options(Config.model_validate({"model": {"path": "m"}}), tmp_path) == {}


@pytest.mark.parametrize("text", ["{}", "not json", '{"text_config": 3}'])
def test_an_unreadable_model_config_leaves_the_run_without_a_pool_cost(
    text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cost estimate never stops a run: the scheduler prices moves as re-prefills (rate 0)."""
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="KV size"):
        kv_bytes_per_token(tmp_path, "float32")
    run = Config.model_validate({"model": {"path": "m"}, "engine": {"kv_pool": {"kind": "local"}}})
    with caplog.at_level("WARNING", logger="rollyard.rollout.gateway_proc"):
        assert pool_options(run, tmp_path) == {}
    assert "KV size per token" in caplog.text
    assert pool_options(run, tmp_path / "missing") == {}
