"""``engine.kv_pool``: config validation, the flags and environment an engine gets, the block store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollyard.core.errors import ConfigError
from rollyard.engines.kvpool import BlockStore, KVPoolConfig, block_keys
from rollyard.engines.launcher import VLLMServer
from rollyard.rollout.config import EngineConfig


def _transfer(args: list[str]) -> dict:
    return json.loads(args[args.index("--kv-transfer-config") + 1])


def test_no_pool_adds_no_flag(tmp_path: Path) -> None:
    assert "--kv-transfer-config" not in VLLMServer(tmp_path).command()


def test_local_pool_passes_our_connector_with_root_and_weights_epoch(tmp_path: Path) -> None:
    pool = KVPoolConfig(kind="local", root=str(tmp_path / "pool"))
    cfg = _transfer(VLLMServer(tmp_path, kv_pool=pool, weights_version=7).command())
    assert cfg["kv_connector"] == "SharedPoolConnector"
    assert cfg["kv_connector_module_path"] == "rollyard.engines.kvpool.connector"
    assert cfg["kv_connector_extra_config"] == {"root": str(tmp_path / "pool"), "epoch": 7}
    assert cfg["kv_load_failure_policy"] == "recompute"


def test_mooncake_pool_gets_its_client_file(tmp_path: Path) -> None:
    pool = KVPoolConfig(kind="mooncake", master="127.0.0.1:5555", segment_mb=64)
    server = VLLMServer(tmp_path, kv_pool=pool, log_path=tmp_path / "e0.log")
    cfg = _transfer(server.command())
    assert cfg["kv_connector"] == "MooncakeStoreConnector"
    assert cfg["kv_connector_extra_config"]["save_decode_cache"] is True  # the next turn extends outputs
    doc = json.loads(Path(server.environment()["MOONCAKE_CONFIG_PATH"]).read_text())
    assert doc["master_server_address"] == "127.0.0.1:5555"
    assert doc["global_segment_size"] == "64MB"


def test_mooncake_without_master_is_refused_at_engine_start(tmp_path: Path) -> None:
    server = VLLMServer(tmp_path, kv_pool=KVPoolConfig(kind="mooncake"), log_path=tmp_path / "e.log")
    with pytest.raises(ConfigError, match="master"):
        server.environment()


def test_lmcache_is_refused_on_a_cpu_engine() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        KVPoolConfig(kind="lmcache").engine_args(cuda=False)
    on_cuda = _transfer(KVPoolConfig(kind="lmcache").engine_args(cuda=True))
    assert on_cuda["kv_connector"] == "LMCacheConnectorV1"


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "redis"},
        {"kind": "local", "root": "relative/dir"},
        {"kind": "local", "master": "127.0.0.1:1"},
        {"kind": "mooncake", "master": "no-port"},
        {"kind": "mooncake", "segment_mb": 1},
        {"kind": "local", "colour": "blue"},
    ],
)
def test_bad_pool_configs_are_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        EngineConfig.model_validate({"kv_pool": bad})


def test_engine_config_defaults_to_no_pool() -> None:
    assert not EngineConfig().kv_pool.enabled


def test_block_keys_name_prefixes() -> None:
    a = list(range(300))
    b = a[:128] + [7] * 172  # shares the first two 64-token blocks with a
    ka, kb = block_keys(a, 64), block_keys(b, 64)
    assert len(ka) == 4  # full blocks only
    assert ka[:2] == kb[:2] and ka[2] != kb[2]
    assert block_keys(a, 64, salt="other")[0] != ka[0]
    assert block_keys(a, 64, start=ka[:2]) == ka  # extends a prefix's keys


def test_store_hits_count_leading_blocks_and_writes_whole_files(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, "ns")
    keys = block_keys(list(range(256)), 64)
    store.put(keys[0], b"x" * 10)
    store.put(keys[2], b"z" * 10)
    assert store.hits(keys) == 1  # a prefix stops at its first missing block
    assert store.get(keys[0]) == b"x" * 10 and store.get(keys[1]) is None
    assert not list(tmp_path.rglob("*.tmp"))
    store.clear()
    assert store.hits(keys) == 0 and not (tmp_path / "ns").exists()


@pytest.mark.parametrize("flag", ["redis", "local:relative/dir", "mooncake:no-port"])
def test_engine_serve_rejects_a_bad_kv_pool_flag_before_starting(flag: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollyard.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["engine", "serve", "--model", str(tmp_path), "--kv-pool", flag])
    assert res.exit_code != 0
    assert isinstance(res.exception, ConfigError) and "--kv-pool" in res.exception.message


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", [(10, 2, 64, 128), (2, 10, 64, 2, 64)])  # CPU; K/V first (CUDA)
def test_a_block_round_trips_through_bytes_into_another_block(dtype: str, layout: tuple[int, ...]) -> None:
    import torch

    from rollyard.engines.kvpool.connector import _block_dim, block_bytes, read_block

    caches = [torch.randn(*layout).to(getattr(torch, dtype)) for _ in range(4)]
    dim = _block_dim(caches[0], 10)
    data = block_bytes([c.select(dim, 3) for c in caches])
    assert read_block(data, [c.select(dim, 7) for c in caches])
    assert all(torch.equal(c.select(dim, 7), c.select(dim, 3)) for c in caches)
    assert not torch.equal(caches[0].select(dim, 6), caches[0].select(dim, 3))  # others untouched
    assert not read_block(data[:-2], [c.select(dim, 5) for c in caches])  # a short file is refused
