"""The config sections of the services a run starts: engines, gateway, sandboxes, weight
publishing and Ray (``rollout.config`` assembles them with the training sections into ``Config``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollyard.core.errors import ConfigError
from rollyard.engines.drafting.config import DraftingConfig
from rollyard.engines.kvpool.config import KVPoolConfig, Role
from rollyard.gateway.settings import GatewayLimits
from rollyard.sandbox.base import Limits
from rollyard.sched import Policy, make_policy


class Section(BaseModel):
    """A config section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class EngineConfig(Section):
    """Local vLLM engines the orchestrator starts (``urls`` instead: engines someone else runs)."""

    count: int = Field(default=1, ge=1)
    urls: list[str] = Field(default_factory=list)
    kv_tokens: int | None = Field(default=16384, ge=1)
    max_model_len: int = Field(default=2048, ge=64)
    startup_timeout_s: float = Field(default=300.0, gt=0)
    restart_on_death: bool = True
    drafting: DraftingConfig = Field(default_factory=DraftingConfig)  # speculative decoding
    kv_pool: KVPoolConfig = Field(default_factory=KVPoolConfig)  # KV shared by the engines
    # prefill/decode split (docs/kv-pool.md): one role for every engine, or one per engine; a
    # program's long first prefill runs on a prefill engine, decoding on a decode engine that
    # loads the prompt from ``kv_pool`` (``gateway.pd_min_prompt_tokens``)
    role: Role | list[Role] = "both"
    # Where the started engines run: "ray" makes each a Ray actor placed on a node with
    # ``cpus_per_engine`` / ``gpus_per_engine`` free (``rollout.ray_engines``); "auto": on Ray
    # when ``ray.address`` is set, else subprocesses of this process.
    placement: Literal["auto", "local", "ray"] = "auto"
    cpus_per_engine: float = Field(default=1.0, gt=0)
    gpus_per_engine: float = Field(default=0.0, ge=0)  # Ray's num_gpus for each engine actor
    tensor_parallel_size: int = Field(default=1, ge=1)  # vLLM's --tensor-parallel-size (GPU)
    # On a CUDA host the KV cache is what this fraction of GPU memory leaves (bf16 weights);
    # ``kv_tokens`` caps it on CPU hosts only.
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)

    def roles(self) -> list[Role]:
        """Each started engine's role (``engine.urls``: one each too)."""
        n = len(self.urls) or self.count
        return list(self.role) if isinstance(self.role, list) else [self.role] * n

    @model_validator(mode="after")
    def _roles(self) -> EngineConfig:
        roles = self.roles()
        if len(roles) != (len(self.urls) or self.count):
            raise ValueError(
                f"engine.role lists {len(roles)} roles for {len(self.urls) or self.count} engines"
            )
        if set(roles) != {"both"} and not self.kv_pool.enabled:
            raise ValueError(
                "engine.role prefill/decode needs engine.kv_pool: the prompt's KV moves through it"
            )
        if not any(r != "prefill" for r in roles):
            raise ValueError("engine.role: at least one engine must decode (role decode or both)")
        return self

    @model_validator(mode="after")
    def _gpus_cover_tp(self) -> EngineConfig:
        if self.tensor_parallel_size > 1 and self.gpus_per_engine < self.tensor_parallel_size:
            raise ValueError(
                f"engine.tensor_parallel_size={self.tensor_parallel_size} needs "
                f"engine.gpus_per_engine >= {self.tensor_parallel_size} (one GPU per shard)"
            )
        return self


class SchedulingConfig(Section):
    """A scheduling preset by name, with any of its parts swapped (``rollyard.sched.registry``)."""

    policy: str = "fifo"
    router: str | None = None
    admission: str | None = None
    order: str | None = None
    tick_s: float | None = Field(default=None, gt=0)
    options: dict[str, float | int | str | bool] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> SchedulingConfig:
        self.build()  # unknown names fail here, with the list of choices
        return self

    def build(self) -> Policy:
        try:
            return make_policy(
                self.policy,
                router=self.router,
                admission=self.admission,
                order=self.order,
                tick_s=self.tick_s,
                **self.options,
            )
        except ConfigError as e:
            raise ValueError(e.message) from None


class DividedConfig(Section):
    """Divided rollout (Seer): generations longer than ``chunk_tokens`` run as chunks, each
    rescheduled (``rollyard.gateway.divided``)."""

    chunk_tokens: int = Field(default=256, ge=1)


class GatewayConfig(Section):
    host: str = "127.0.0.1"  # the address it binds; 0.0.0.0 for rollout workers on other nodes
    # the address workers on other machines dial (a host, an IP or a URL); unset: the bind
    # address, or this host's first non-loopback address when bound to a wildcard
    advertise: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)  # None: a free port
    capacity: int = Field(default=64, ge=1)  # concurrent engine requests per engine
    # gateway shards, one process each (``gateway/shards.py``): a program lives on one, each
    # schedules 1/workers of every engine; ports port .. port + workers - 1
    workers: int = Field(default=1, ge=1, le=64)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    divided: DividedConfig | None = None  # None: every generation runs in one piece
    # with prefill engines (engine.role), a program's first prompt of at least this many tokens is
    # prefilled there (max_tokens 1) before a decode engine continues it from the KV pool; a prompt
    # with no full KV block before its last token is never prefilled (nothing to load)
    pd_min_prompt_tokens: int = Field(default=512, ge=1)
    limits: GatewayLimits = Field(default_factory=GatewayLimits)  # body size, /metrics, budgets

    @model_validator(mode="before")
    @classmethod
    def _policy_shorthand(cls, data: Any) -> Any:
        """``gateway.policy: NAME`` is short for ``gateway.scheduling.policy: NAME``."""
        if isinstance(data, dict) and "policy" in data:
            data = dict(data)
            name = data.pop("policy")
            data["scheduling"] = {**(data.get("scheduling") or {}), "policy": name}
        return data


class SandboxConfig(Section):
    provider: Literal["bwrap", "local"] = "bwrap"
    ahead: int = Field(default=1, ge=0)  # prepared sandboxes per task, ahead of demand
    # decoy test dirs + access times on test-like files in every program's sandbox (TEST_ACCESS
    # events, the step's count_test_access); monitored programs get sandboxes of their own
    monitor_tests: bool = False
    # every program's sandbox limits (sandbox.base.Limits keys: memory_mb, cpu_seconds,
    # max_processes, wall_seconds, disk_mb, ...); a black-box profile's own `limits` go on top
    limits: dict[str, Any] = Field(default_factory=dict)

    @field_validator("limits")
    @classmethod
    def _known_limits(cls, v: dict[str, Any]) -> dict[str, Any]:
        Limits.model_validate(v)  # unknown keys and bad values fail when the config loads
        return v

    def program_limits(self) -> Limits:
        return Limits.model_validate(self.limits)


class PublishConfig(Section):
    """How trained weights reach the engines (docs/training.md, "Publishing weights").

    ``memory``: streamed over a gloo group into each engine's worker, no file; every engine must
    run rollyard's worker extension (the launcher's engines do) and reach the trainer at
    ``host``. ``disk``: a safetensors dir each engine reloads, for engines that cannot.
    Both update each engine behind the version fence."""

    mode: Literal["memory", "disk"] = "memory"
    bucket_mb: int = Field(default=512, ge=1)  # the largest flat buffer sent at once
    host: str = "127.0.0.1"  # where engines reach the trainer's weight group
    timeout_s: float = Field(default=120.0, gt=0)  # a gloo send or receive that waits longer fails


class RayConfig(Section):
    address: str | None = None  # "local" starts a local cluster; else a ray:// or host:port address
    workers: int = Field(default=2, ge=1)
    num_cpus_per_worker: float = Field(default=0.5, gt=0)
