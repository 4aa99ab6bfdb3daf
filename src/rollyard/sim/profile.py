"""An engine profile: what one simulated engine costs and holds, as a few fitted numbers.

One forward step of a continuous-batching engine that processes ``tokens`` new tokens
(prefill chunks plus one per decoding request) for ``seqs`` requests takes

    step_s = overhead_s + per_token_s * tokens + per_seq_s * seqs
             + decode_attn_s * decode_ctx + prefill_attn_s * prefill_pairs

``overhead_s`` is the fixed cost of a step (reading the weights on a GPU, Python and kernel
launches on a CPU), ``per_token_s`` the matmul cost of one token, ``decode_attn_s`` the cost of
reading one cached token when a decoding request attends over its context (``decode_ctx`` is
the sum of those contexts: memory-bound on a GPU), ``prefill_attn_s`` the cost of one
(new token, earlier token) pair inside a prefill chunk (compute-bound). ``rollyard sim
calibrate`` fits these to a real engine; the GPU profiles shipped beside this file are derived
from published hardware numbers. The optional ``gateway``, ``trainer`` and ``publish``
sections charge the rest of a run (``sim.costs``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollyard.core.errors import ConfigError
from rollyard.sim.costs import GatewayCost, PublishCost, TrainerCost

__all__ = [
    "EngineProfile",
    "load_gateway",
    "load_profile",
    "profile_names",
    "save_profile",
    "write_text",
    "write_yaml",
]


class EngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    source: str = ""  # where the numbers come from (calibration run, published specs)
    overhead_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    per_seq_s: float = Field(default=0.0, ge=0)
    decode_attn_s: float = Field(default=0.0, ge=0)
    prefill_attn_s: float = Field(default=0.0, ge=0)
    request_s: float = Field(default=0.0, ge=0)  # per request before it reaches the engine (HTTP)
    block_size: int = Field(default=16, ge=1)
    num_blocks: int = Field(ge=1)  # KV capacity = num_blocks * block_size tokens
    max_num_seqs: int = Field(default=256, ge=1)  # vLLM's running-batch limit
    max_batched_tokens: int = Field(default=8192, ge=1)  # tokens per step (chunked prefill budget)
    max_model_len: int = Field(default=32768, ge=16)
    tensor_parallel: int = Field(default=1, ge=1)  # GPUs per engine (what a GPU count buys in engines)
    # A KV pool shared by the engines (``rollyard sim --kv-pool``): a context stored there loads at
    # ``pool_bytes_per_s`` instead of being prefilled; None: the profile cannot simulate one.
    kv_bytes_per_token: int | None = Field(default=None, ge=1)
    pool_bytes_per_s: float | None = Field(default=None, gt=0)
    # What a cluster run pays beside the engines (``sim.costs``); absent: free, as before.
    gateway: GatewayCost | None = None
    trainer: TrainerCost | None = None
    publish: PublishCost | None = None

    @model_validator(mode="after")
    def _fits(self) -> EngineProfile:
        if self.kv_tokens < self.max_model_len:
            raise ValueError(f"KV cache ({self.kv_tokens} tokens) < max_model_len ({self.max_model_len})")
        return self

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def pool_load_tok_s(self) -> float:
        """Tokens/s a context loads from the KV pool (0: the profile has no pool terms)."""
        if self.kv_bytes_per_token is None or self.pool_bytes_per_s is None:
            return 0.0
        return self.pool_bytes_per_s / self.kv_bytes_per_token

    def pool_load_s(self, tokens: int) -> float:
        """Seconds to load ``tokens`` of context from the pool: tokens x bytes per token / bandwidth."""
        return tokens / self.pool_load_tok_s

    def with_kv_tokens(self, tokens: int) -> EngineProfile:
        """The same engine with a KV cache of ``tokens`` (whole blocks): what a larger model, a
        longer context or a lower ``gpu_memory_utilization`` leaves of the same GPU, named so
        reports say so. Like vLLM, refuses a cache that cannot hold one ``max_model_len`` sequence."""
        blocks = -(-tokens // self.block_size)
        try:
            return EngineProfile.model_validate(
                {**self.model_dump(), "name": f"{self.name}-kv{tokens}", "num_blocks": blocks}
            )
        except ValidationError as e:
            raise ConfigError(f"--kv-tokens {tokens}: {e.errors()[0]['msg']}") from None

    def with_costs(
        self,
        *,
        gateway: GatewayCost | None = None,
        shards: int | None = None,
        publish_mode: str | None = None,
    ) -> EngineProfile:
        """The same engine with another gateway cost, shard count or publish mode (CLI overrides)."""
        data = self.model_dump()
        if gateway is not None:
            data["gateway"] = gateway.model_dump()
        if shards is not None:
            if data["gateway"] is None:
                raise ConfigError(f"profile {self.name} has no gateway cost to shard (--gateway-cost FILE)")
            data["gateway"]["shards"] = shards
        if publish_mode is not None:
            if data["publish"] is None:
                raise ConfigError(f"profile {self.name} has no publish section to set the mode of")
            data["publish"]["mode"] = publish_mode
        try:
            return EngineProfile.model_validate(data)
        except ValidationError as e:
            raise ConfigError(f"profile {self.name}: {e.errors()[0]['msg']}") from None

    def step_s(self, tokens: int, seqs: int, decode_ctx: float = 0.0, prefill_pairs: float = 0.0) -> float:
        return (
            self.overhead_s
            + self.per_token_s * tokens
            + self.per_seq_s * seqs
            + self.decode_attn_s * decode_ctx
            + self.prefill_attn_s * prefill_pairs
        )


def profile_names() -> list[str]:
    """The profiles shipped with rollyard (``rollyard/sim/profiles/*.yaml``)."""
    folder = resources.files("rollyard.sim") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> EngineProfile:
    """A shipped profile by name, or a YAML file (``rollyard sim calibrate`` writes one)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"engine profile {path} does not exist")
        text, label = path.read_text(), str(path)
    else:
        name = str(name_or_path)
        if name not in profile_names():
            raise ConfigError(f"unknown engine profile {name!r}; choose one of: {', '.join(profile_names())}")
        text = (resources.files("rollyard.sim") / "profiles" / f"{name}.yaml").read_text()
        label = f"builtin:{name}"
    try:
        return EngineProfile.model_validate(yaml.safe_load(text))
    except (ValidationError, yaml.YAMLError, TypeError) as e:
        raise ConfigError(f"engine profile {label} is invalid: {e}") from None


def save_profile(profile: EngineProfile, path: Path, comment: str = "") -> None:
    """Write the profile as YAML, atomically (a half-written profile never exists)."""
    write_yaml(path, profile.model_dump(mode="json", exclude_none=True), comment)


def write_yaml(path: Path, data: dict[str, Any], comment: str = "") -> None:
    """``data`` as YAML under ``comment`` lines, written then renamed into place."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    write_text(path, head + yaml.safe_dump(data, sort_keys=False))


def write_text(path: Path, text: str) -> None:
    """Write then rename: a reader never meets a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_gateway(path: str | Path) -> GatewayCost:
    """A gateway cost YAML (``rollyard sim calibrate --gateway`` writes one)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"gateway cost file {p} does not exist")
    try:
        return GatewayCost.model_validate(yaml.safe_load(p.read_text()))
    except (ValidationError, yaml.YAMLError, TypeError) as e:
        raise ConfigError(f"gateway cost file {p} is invalid: {e}") from None
