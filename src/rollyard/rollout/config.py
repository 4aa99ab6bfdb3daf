"""The run configuration, split by component and loaded from YAML with clear errors.

Every section rejects unknown keys; a bad value is reported with its dotted path
(``trainer.lr: Input should be greater than 0``). The defaults live in
``rollyard/configs/demo.yaml``; a user's file is merged over nothing, so what they write is
what runs, and the resolved config is written to the run directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from rollyard.agents.context import PolicyKind
from rollyard.agents.tools import ToolChoice
from rollyard.core.errors import ConfigError, InvalidRequest
from rollyard.core.net import is_loopback
from rollyard.engines.pretrained import PRETRAINED
from rollyard.rl.advantages import AdvantageConfig
from rollyard.rl.buffer.config import BufferConfig
from rollyard.rl.masks import StabilityMasks
from rollyard.rl.rewards import RewardConfig
from rollyard.rollout.config_services import (
    EngineConfig,
    GatewayConfig,
    PublishConfig,
    RayConfig,
    SandboxConfig,
    Section,
)
from rollyard.sandbox.base import SandboxSpec
from rollyard.sandbox.perturb import Perturbation, PerturbationRecord
from rollyard.sandbox.perturb import apply as apply_perturbation
from rollyard.train.trainer import TrainConfig


class ModelConfig(Section):
    """Where the policy's weights start; ``create`` makes the model there if it is missing: the
    random tiny/small model of ``size``, or the ``pretrained`` one (``rollyard model init --from``)."""

    path: Path
    create: bool = False
    size: str = "tiny"
    seed: int = 0
    pretrained: str | None = None  # e.g. smollm2-135m (converted once into the cache, then copied)

    @model_validator(mode="after")
    def _known_pretrained(self) -> ModelConfig:
        if self.pretrained is not None and self.pretrained not in PRETRAINED:
            raise ValueError(f"unknown pretrained model {self.pretrained!r}; known: {', '.join(PRETRAINED)}")
        return self


class TaskSetConfig(Section):
    """A task family generated into the run dir, or a directory of task dirs."""

    family: str | None = "lookup"
    n: int = Field(default=32, ge=1)
    seed: int = 0
    path: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TaskSetConfig:
        if (self.family is None) == (self.path is None):
            raise ValueError("give exactly one of family or path")
        return self


class PerturbConfig(Section):
    """Break a program's environment on purpose (ROLL): with probability ``prob``, one of
    ``kinds`` (``dead_mirror``; ``remove_tool`` / ``rename_tool`` with a ``target`` path)."""

    prob: float = Field(default=0.0, ge=0.0, le=1.0)
    kinds: list[Perturbation] = Field(default_factory=list)

    @model_validator(mode="after")
    def _applicable(self) -> PerturbConfig:
        for p in self.kinds:
            try:
                apply_perturbation(SandboxSpec(), PerturbationRecord(seed=0, perturbations=[p]))
            except InvalidRequest as e:
                raise ValueError(e.message) from None
        if self.prob > 0 and not self.kinds:
            raise ValueError("perturb.prob > 0 needs at least one entry in perturb.kinds")
        return self


class TasksConfig(Section):
    train: TaskSetConfig = Field(default_factory=TaskSetConfig)
    eval: TaskSetConfig | None = None  # held-out tasks; None: no held-out evaluation
    validate_tasks: bool = True  # golden passes, no-op fails, before anything runs
    perturb: PerturbConfig = Field(default_factory=PerturbConfig)


class ContextSection(Section):
    """Context management as an agent action (white-box agent): when the conversation passes
    ``threshold`` of the engine's context (``engine.max_model_len``), apply ``policy``, tell the
    model in-context, and start a new segment."""

    policy: PolicyKind
    threshold: float = Field(default=0.3, gt=0.0, le=1.0)
    keep: int = Field(default=5, ge=1)  # keep_first_last: the first and last N assistant turns


class AgentSection(Section):
    """The white-box tool loop (in this process), or an unmodified CLI agent run in each program's
    sandbox by a black-box runner profile (a shipped name such as ``openai``, or a YAML path)."""

    kind: Literal["whitebox", "blackbox"] = "whitebox"
    profile: str | None = None  # blackbox: the runner profile
    max_turns: int = Field(default=6, ge=1)
    max_tokens: int = Field(default=96, ge=1)  # per model call
    timeout_s: float = Field(default=120.0, gt=0)  # a hung agent is terminated after this
    tool_timeout_s: float = Field(default=20.0, gt=0)
    max_tool_output_chars: int = Field(default=400, ge=64)
    # whitebox: ``required`` makes every model turn a tool call (the gateway constrains decoding
    # to one well-formed call; the turn records it), so even a random model acts in its sandbox;
    # a tool's name (bash, read_file, write_file, submit) forces a call to that tool
    tool_choice: ToolChoice = "auto"
    # whitebox, with tool_choice not auto: only the first N turns are forced; later turns are the
    # model's own (unconstrained) choice, whose logprobs are the policy's; None: every turn
    required_turns: int | None = Field(default=None, ge=1)
    # whitebox: bash commands run before the first model turn, shown as the agent's own calls with
    # their real results (a scripted orientation step; never trained: no engine sampled them)
    opening: list[str] = Field(default_factory=list)
    context: ContextSection | None = None  # whitebox: context management; None: never compacted
    # stop the run, with the agent's own error, after this many programs in a row ended without a
    # single model turn (a CLI that cannot start would otherwise be replaced forever)
    max_silent_programs: int = Field(default=8, ge=1)


class TrainerConfig(TrainConfig):
    """The trainer's own settings (optimizer, loss, packing) plus how advantages are computed."""

    lr: float = Field(default=1e-4, gt=0)
    advantages: AdvantageConfig = Field(default_factory=AdvantageConfig)
    masks: StabilityMasks = Field(default_factory=StabilityMasks)  # samples left out of the loss
    threads: int = Field(default=2, ge=1)  # torch intra-op threads
    world_size: int = Field(default=1, ge=1)  # FSDP2 trainer ranks (gloo on CPU, nccl on GPU)
    # Where ranks 1..N-1 run: "ray" makes them Ray actors reserved through one placement group
    # (``train/ray_ranks.py``), each bundle ``cpus_per_rank`` CPUs (+ 1 GPU where CUDA is);
    # "local": processes spawned on this host; "auto": on Ray when ``ray.address`` is set and
    # world_size > 1. Rank 0 always runs in the run's process (it publishes).
    placement: Literal["auto", "local", "ray"] = "auto"
    cpus_per_rank: float = Field(default=1.0, gt=0)
    ray_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # How long a rank waits in one collective (the rendezvous included) for the others before it
    # fails; torch's default is 30 minutes, long for a lost rank's node to hold the run.
    collective_timeout_s: float = Field(default=600.0, gt=0, le=86400)

    def train_config(self) -> TrainConfig:
        local = {"advantages", "masks", "threads", "world_size", "placement", "cpus_per_rank"}
        local |= {"ray_strategy", "collective_timeout_s"}  # where the ranks run, not how they train
        return TrainConfig.model_validate(self.model_dump(exclude=local))


SCRIPTED_FAMILIES = ("readout", "lookup")  # sft.kind scripted: tasks that name a key to find in data/


class SftConfig(Section):
    """Warm start on scripted-solver demonstrations (deliberately imperfect). With a blackbox
    agent, ``kind`` picks how: ``finish``: ``demos`` programs of the CLI on the base model, each
    recorded prompt answered with the profile's ``finish`` reply and the end-of-turn token
    (``mistake_prob`` unused); ``scripted``: ``demos`` programs of the CLI against a scripted
    engine that solves ``readout``/``lookup`` tasks in the CLI's own turn format, guessing with
    ``mistake_prob`` (``rollout/sft_scripted.py``). The white-box warm start is always scripted."""

    enabled: bool = False
    kind: Literal["finish", "scripted"] = "finish"
    demos: int = Field(default=128, ge=1)
    mistake_prob: float = Field(default=0.3, ge=0.0, le=1.0)
    epochs: int = Field(default=2, ge=1)
    batch: int = Field(default=16, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    train_layers: int | None = Field(default=None, ge=1)  # None: every layer; N: the top N


class EvalConfig(Section):
    every: int = Field(default=5, ge=1)  # held-out evaluation every N steps (and at 0 and the end)
    samples: int = Field(default=2, ge=1)  # per held-out task
    temperature: float = Field(default=1.0, ge=0.0)


class RunConfig(Section):
    # async: rollouts never wait for training (buffer staleness bound); sync: each step's groups
    # are rolled out together, then trained, then weights published (rollout/sync.py)
    mode: Literal["async", "sync"] = "async"
    steps: int = Field(default=20, ge=1)
    groups_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(default=4, ge=2)
    temperature: float = Field(default=1.0, ge=0.0)
    # nucleus sampling for every program; below 1 the engine records the truncated, renormalised
    # distribution while the trainer scores the full one: a real train/inference mismatch that
    # IPA's mask and the off-policy corrections see (docs/training.md)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_groups_in_flight: int = Field(default=8, ge=1)
    # programs running at once (train + held-out); unset: what the engines' KV, the cores and the
    # memory hold (rollout/capacity.py, docs/training.md)
    max_programs: int | None = Field(default=None, ge=1)
    seed: int = 0
    # steps between sharded checkpoints (always after the last); each is a collective write of
    # model and optimizer, so not every step. Resuming replays at most this many steps.
    checkpoint_every: int = Field(default=10, ge=1)
    keep_weights: int = Field(default=2, ge=1)
    progress: bool = True
    # experiment trackers beside RUN_DIR/metrics.jsonl (always written): tensorboard, wandb (offline
    # unless WANDB_MODE is set); every metrics row goes to each
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl"])


class Config(Section):
    """One run: each section belongs to one component."""

    model: ModelConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    agent: AgentSection = Field(default_factory=AgentSection)
    rewards: RewardConfig = Field(default_factory=RewardConfig)
    buffer: BufferConfig = Field(
        default_factory=lambda: BufferConfig(
            rule="window", window_fraction=1.0, max_staleness=1, group_whole=True
        )
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sft: SftConfig = Field(default_factory=SftConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @model_validator(mode="after")
    def _buffer_groups(self) -> Config:
        if not self.buffer.group_whole:
            raise ValueError("buffer.group_whole must be true: the trainer takes whole groups")
        return self

    @model_validator(mode="after")
    def _ipa_chunks(self) -> Config:
        if self.trainer.loss.kind == "ipa" and self.trainer.advantages.mode != "chunk":
            raise ValueError("trainer.loss.kind: ipa needs trainer.advantages.mode: chunk (it trains chunks)")
        return self

    @model_validator(mode="after")
    def _own_sandboxes_local(self) -> Config:
        if self.ray.address and (self.sandbox.monitor_tests or self.tasks.perturb.prob > 0):
            raise ValueError("sandbox.monitor_tests and tasks.perturb run with local workers only")
        return self

    @model_validator(mode="after")
    def _engines_on_ray(self) -> Config:
        e = self.engine
        if e.placement == "ray" and not self.ray.address:
            raise ValueError("engine.placement: ray needs ray.address (or --ray)")
        if e.gpus_per_engine > 0 and not self.engines_on_ray:
            raise ValueError("engine.gpus_per_engine places engines on Ray: set ray.address (or --ray)")
        remote = self.engines_on_ray and self.ray.address != "local"
        if remote and self.publish.mode == "memory" and is_loopback(self.publish.host):
            raise ValueError(
                f"publish.host {self.publish.host} is loopback, but the engines run on Ray nodes: set it "
                "to an address of this node that they reach (or publish.mode: disk on a shared path)"
            )
        return self

    @model_validator(mode="after")
    def _ranks_on_ray(self) -> Config:
        if self.trainer.placement == "ray" and not self.ray.address:
            raise ValueError(
                "trainer.placement: ray needs ray.address (or --ray on a new run; a resumed run keeps "
                "the ray.address it was started with, so resume with placement ray only a run started on Ray)"
            )
        return self

    @property
    def ranks_on_ray(self) -> bool:
        """Trainer ranks 1..N-1 are Ray actors (``train/ray_ranks.py``), not local processes."""
        t = self.trainer
        if t.placement == "local" or t.world_size < 2:
            return False
        return t.placement == "ray" or self.ray.address is not None

    @property
    def engines_on_ray(self) -> bool:
        """The run starts its engines as Ray actors (none when it attaches to ``engine.urls``)."""
        if self.engine.urls or self.engine.placement == "local":
            return False
        return self.engine.placement == "ray" or self.ray.address is not None

    @model_validator(mode="after")
    def _blackbox_agent(self) -> Config:
        if self.agent.kind == "blackbox":
            if not self.agent.profile:
                raise ValueError("agent.profile is required with agent.kind: blackbox (e.g. openai)")
            from rollyard.agents.blackbox import load_profile

            try:
                load_profile(self.agent.profile)
            except ConfigError as e:
                raise ValueError(f"agent.profile: {e.message}") from None
            a = self.agent
            if a.context is not None or a.tool_choice != "auto" or a.required_turns or a.opening:
                raise ValueError(
                    "agent.context, tool_choice, required_turns and opening configure the whitebox agent only"
                )
        if self.sft.enabled and self.sft.kind == "scripted":
            self._check_scripted_sft()
        if self.agent.required_turns is not None and self.agent.tool_choice == "auto":
            raise ValueError("agent.required_turns needs agent.tool_choice: required (or a tool's name)")
        return self

    def _check_scripted_sft(self) -> None:
        """The script greps a key named in the task and answers through a ``bash`` tool call."""
        if self.agent.kind != "blackbox":
            raise ValueError(
                "sft.kind: scripted runs a blackbox CLI against the script: set agent.kind: blackbox"
            )
        family = self.tasks.train.family
        if family not in SCRIPTED_FAMILIES:
            raise ValueError(
                f"sft.kind: scripted scripts {' and '.join(SCRIPTED_FAMILIES)} tasks, not {family!r}"
            )
        from rollyard.agents.blackbox import load_profile

        if load_profile(self.agent.profile or "").finish.tool != "bash":
            raise ValueError(
                f"sft.kind: scripted replies with bash tool calls; agent.profile {self.agent.profile!r} "
                "does not finish with one (its finish.tool must be bash)"
            )


def describe(e: ValidationError) -> str:
    """Every error with its dotted path, one per line."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown key")
        elif err["type"] == "missing":
            lines.append(f"{loc}: missing")
        else:
            lines.append(f"{loc}: {err['msg']}")
    return "\n".join(lines)


def _set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    node = doc
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_config(doc: Any, source: str, overrides: dict[str, Any] | None = None) -> Config:
    """Validate a loaded YAML document; ``overrides`` are dotted keys (``run.steps``) applied first."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the config must be a mapping of sections, not {type(doc).__name__}")
    for k, v in (overrides or {}).items():
        _set_path(doc, k, v)
    try:
        return Config.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid config\n{describe(e)}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read and validate a YAML config; relative paths in it are relative to the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    cfg = parse_config(doc, str(p), overrides)
    return resolve_paths(cfg, p.parent)


def resolve_paths(cfg: Config, base: Path) -> Config:
    def fix(x: Path | None) -> Path | None:
        return None if x is None or x.is_absolute() else (base / x).resolve()

    cfg.model.path = fix(cfg.model.path) or cfg.model.path
    for ts in (cfg.tasks.train, cfg.tasks.eval):
        if ts is not None and ts.path is not None:
            ts.path = fix(ts.path)
    return cfg


def builtin_config(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """An embedded config (``demo``, ``quick``) from ``rollyard/configs``; its paths stay relative."""
    try:
        text = resources.files("rollyard.configs").joinpath(f"{name}.yaml").read_text()
    except FileNotFoundError:
        raise ConfigError(f"no built-in config {name!r}") from None
    return parse_config(yaml.safe_load(text), f"builtin:{name}", overrides)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
