"""run.max_programs unset: the documented rule (rollout/capacity.py, docs/training.md)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rollyard.core.errors import ConfigError
from rollyard.core.net import free_port
from rollyard.engines.vllm import VLLMBackend
from rollyard.rollout.capacity import (
    PROGRAMS_PER_CONTEXT,
    PROGRAMS_PER_CORE,
    Hardware,
    default_max_programs,
    program_slots,
)
from rollyard.rollout.config import Config, load_config

ROOMY = 1 << 30  # MB: a memory bound that never binds


def config(**sections: dict) -> Config:
    return Config.model_validate({"model": {"path": "m"}, **sections})


def test_the_kv_bound_is_two_programs_per_context_of_every_engines_kv() -> None:
    cfg = config(engine={"kv_tokens": None, "max_model_len": 4096})
    hw = Hardware(engine_kv_tokens=(100_000, 60_000), cores=64, available_mb=ROOMY)
    n, bounds = default_max_programs(cfg, hw)
    assert n == bounds["kv"] == PROGRAMS_PER_CONTEXT * 160_000 // 4096
    more = Hardware(engine_kv_tokens=(100_000, 60_000, 160_000), cores=64, available_mb=ROOMY)
    assert default_max_programs(cfg, more)[0] == 2 * n  # twice the KV, twice the programs


def test_engine_kv_tokens_caps_what_an_engine_reports_and_stands_in_when_it_reports_none() -> None:
    cfg = config(engine={"kv_tokens": 16384, "max_model_len": 2048})
    reported = Hardware(engine_kv_tokens=(1_000_000,), cores=64, available_mb=ROOMY)
    silent = Hardware(engine_kv_tokens=(0,), cores=64, available_mb=ROOMY)
    expect = PROGRAMS_PER_CONTEXT * 16384 // 2048
    assert default_max_programs(cfg, reported)[1]["kv"] == expect
    assert default_max_programs(cfg, silent)[1]["kv"] == expect
    uncapped = config(engine={"kv_tokens": None, "max_model_len": 2048})
    assert default_max_programs(uncapped, silent)[1]["kv"] == PROGRAMS_PER_CONTEXT  # one context


def test_cores_and_memory_bound_local_sandboxes_only() -> None:
    cfg = config(engine={"kv_tokens": None}, sandbox={"limits": {"memory_mb": 512}})
    hw = Hardware(engine_kv_tokens=(10_000_000,), cores=3, available_mb=ROOMY)
    assert default_max_programs(cfg, hw)[0] == PROGRAMS_PER_CORE * 3
    tight = Hardware(engine_kv_tokens=(10_000_000,), cores=64, available_mb=5 * 512 + 100)
    assert default_max_programs(cfg, tight)[0] == 5  # each sandbox may reach its 512 MB at once
    on_ray = config(engine={"kv_tokens": None}, ray={"address": "local"})
    n, bounds = default_max_programs(on_ray, tight)
    assert set(bounds) == {"kv"} and n == bounds["kv"] > 5  # the cluster's workers run sandboxes


def test_at_least_one_program_runs_whatever_the_machine() -> None:
    cfg = config(engine={"kv_tokens": None})
    assert default_max_programs(cfg, Hardware((0,), cores=1, available_mb=10))[0] == 1


def test_the_default_is_the_rule_on_this_machine_and_a_set_value_wins(tmp_path: Path) -> None:
    cfg = config()
    assert cfg.run.max_programs is None
    dead = VLLMBackend(f"http://127.0.0.1:{free_port()}", name="e0", max_model_len=2048, timeout_s=2.0)

    async def slots(c: Config) -> int:
        try:
            return await program_slots(c, [dead])
        finally:
            await dead.aclose()

    n = asyncio.run(slots(cfg))  # an engine that does not answer counts as engine.kv_tokens
    cores = len(os.sched_getaffinity(0))
    by_kv = PROGRAMS_PER_CONTEXT * cfg.engine.kv_tokens // cfg.engine.max_model_len  # type: ignore[operator]
    assert 1 <= n <= min(by_kv, PROGRAMS_PER_CORE * cores)
    assert asyncio.run(slots(config(run={"max_programs": 3}))) == 3
    (tmp_path / "c.yaml").write_text("model: {path: m}\nrun: {max_programs: 0}\n")
    with pytest.raises(ConfigError, match=r"run\.max_programs"):
        load_config(tmp_path / "c.yaml")
