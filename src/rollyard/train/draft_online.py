"""The eagle draft head in a ``rollyard train`` run (``engine.drafting.method: eagle``).

Before the engines start, ``prepare_head`` resolves ``head: auto``: a head made from the
starting policy and warm-trained on the warm start's demonstrations, cached under the model
cache by what decides it. With ``online: true`` ``OnlineHead`` then runs one Top-K KL step per
RL step on that step's trajectories, against the policy just updated, and the head goes out
with the new version (disk: written into its dir as ``draft_head/`` before the engines reload;
memory: its tensors after the policy's), which the worker extension loads into vLLM's drafter
in the same RPC as that version's policy. What holds: after each publish every engine serves
the head trained against the version it serves (and in memory mode a restarted engine's
catch-up gets it too). What does not: an engine restarted in disk mode comes back with the
starting head (its launch's ``head``) beside the live policy until the next publish; a failed
disk publish rolls the engines back to the previous version's dir, and when that is the base
(v0, no ``draft_head/``) they keep the head just loaded.

The head, its AdamW state and its counters go into the trainer's checkpoint (``state_dict``,
under ``extra_state["draft_head"]``: the same staged write and rename) and come back on
``--resume`` (``online_head(..., resumed=...)``), so a resumed run trains on from the saved
head. ``served_head`` points an engine (re)started on a published version's dir (a resumed
disk run, a restarted engine) at the head saved beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rollyard.core.cache import cache_dir
from rollyard.core.errors import ConfigError, TrainError
from rollyard.core.sample import Sample
from rollyard.engines.drafting.config import DraftingConfig
from rollyard.engines.drafting.eagle_files import HEAD_DIR, HEAD_FILE, HEAD_PREFIX
from rollyard.train.draft_head import (
    HEAD_OPTIM,
    EagleHead,
    HeadTrainer,
    head_config,
    load_head,
    policy_targets,
    save_head,
    warm_train,
)
from rollyard.train.memory_publish import MemoryLinks
from rollyard.train.publish import WeightPublisher

log = logging.getLogger(__name__)

WARM_ROWS = 32  # demonstrations the warm start fits (one policy forward each, ~30-200 tok/s here)


def _rows(samples: Sequence[Sample], n: int, max_len: int) -> list[list[int]]:
    """The ``n`` longest samples' tokens (the most positions per policy forward), cut to
    their last ``max_len``."""
    longest = sorted(samples, key=lambda s: len(s.token_ids), reverse=True)[:n]
    return [s.token_ids[-max_len:] for s in longest]


def _key(start: Path, demos: Path | None, cfg: DraftingConfig, seed: int) -> str:
    """What decides an auto head: the policy, the demos, the head knobs and the warm start's seed."""
    parts: dict[str, Any] = {
        "policy": [
            (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(start.glob("*.safetensors"))
        ],
        "policy_dir": str(start.resolve()),
        "demos": hashlib.sha256(demos.read_bytes()).hexdigest() if demos else None,
        "head": cfg.model_dump(mode="json", include={"topk", "warm_steps", "max_len", "lr"}),
        "seed": seed if demos else None,  # the warm start's row draws; no warm start, no draws
        "recipe": 2,  # 2: the warm-up's AdamW state is kept beside the head
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def check_eagle_publish(cfg: DraftingConfig, publish_mode: str) -> None:
    """Before anything starts: the CUDA (NCCL) memory publish does not carry an online head."""
    from rollyard.engines.launcher import has_cuda_gpu

    if cfg.method == "eagle" and cfg.online and publish_mode == "memory" and has_cuda_gpu():
        raise ConfigError(
            "engine.drafting.online with method eagle: the CUDA (NCCL) memory publish does not carry "
            "the head; use publish.mode: disk or online: false"
        )


def check_eagle_policy(cfg: DraftingConfig, start: Path) -> None:
    """Before the warm start: the policy is one an eagle head fits (Llama), and ``topk`` is
    within its vocabulary."""
    if cfg.method != "eagle":
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(start)
    head_config(config)  # ConfigError for a non-Llama policy
    if cfg.topk > config.vocab_size:
        raise ConfigError(
            f"engine.drafting.topk: {cfg.topk} is over the policy's vocabulary ({config.vocab_size})"
        )


def prepare_head(cfg: DraftingConfig, start: Path, demos: Path | None, seed: int = 0) -> DraftingConfig:
    """``cfg`` with ``head`` a dir vLLM can load: as given, or for ``auto`` made now (or taken
    from the cache). ``demos``: the warm start's demonstrations (JSON lines of ``Sample``)."""
    if cfg.method != "eagle" or cfg.head != "auto":
        if cfg.method == "eagle" and not (Path(cfg.head) / HEAD_FILE).is_file():
            raise ConfigError(f"engine.drafting.head: {cfg.head} has no {HEAD_FILE} (or use head: auto)")
        return cfg
    if cfg.warm_steps and demos is None:
        raise ConfigError(
            "engine.drafting.head: auto warm-trains on the SFT warm start's demonstrations: "
            "turn on sft, give a head dir, or set warm_steps: 0"
        )
    out = cache_dir() / "models" / "eagle-heads" / _key(start, demos if cfg.warm_steps else None, cfg, seed)
    if not (out / HEAD_FILE).is_file():
        import torch
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).eval().requires_grad_(False)
        head = EagleHead.from_policy(policy)
        stats: list[dict[str, float]] = []
        optim = None
        if cfg.warm_steps and demos is not None:
            samples = [Sample.model_validate_json(line) for line in demos.read_text().splitlines() if line]
            targets = policy_targets(policy, _rows(samples, WARM_ROWS, cfg.max_len), cfg.topk, cfg.max_len)
            torch.manual_seed(seed)
            trainer = HeadTrainer(head, policy, topk=cfg.topk, lr=cfg.lr)
            stats = warm_train(trainer, targets, cfg.warm_steps, seed=seed)
            optim = trainer.opt.state_dict()  # the online head continues it (``HEAD_OPTIM``)
            log.info("eagle head warm-trained steps=%d first=%s last=%s", len(stats), stats[0], stats[-1])
        meta = {"warm_steps": len(stats), "warm": stats[-1:] or None, "policy": str(start)}
        save_head(head, out, meta, optim)
    return cfg.model_copy(update={"head": str(out)})


class OnlineHead:
    """The head trained beside the policy: ``step`` after each policy step, ``write_beside``
    into each published version's dir.

    ``model`` is called each step: a multi-rank trainer's ``model`` is a fresh gathered copy
    after every step, so a model kept once would stay the starting policy."""

    def __init__(self, cfg: DraftingConfig, model: Callable[[], Any]) -> None:
        self.cfg = cfg
        self.model = model
        policy = model()
        self.head = load_head(cfg.head, policy)
        self.trainer = HeadTrainer(self.head, policy, topk=cfg.topk, lr=cfg.lr)
        warm = Path(cfg.head) / HEAD_OPTIM
        if warm.is_file():  # go on with the warm-up's AdamW: a fresh one's first step is lr * sign
            import torch

            self.trainer.opt.load_state_dict(torch.load(warm, map_location="cpu", weights_only=True))

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One head step on the step's longest ``rows`` trajectories (one no-grad policy
        forward each, on the policy as just updated)."""
        policy = self.model()
        self.trainer.policy = policy
        was_training = policy.training
        policy.eval()
        try:
            rows = _rows(samples, self.cfg.rows, self.cfg.max_len)
            targets = policy_targets(policy, rows, self.cfg.topk, self.cfg.max_len)
        finally:
            policy.train(was_training)
        if not targets:
            return {}
        out = self.trainer.step(targets)
        out["draft_head_steps"] = float(self.trainer.steps)
        out["draft_head_skipped_total"] = float(self.trainer.skipped)
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the head: its weights (on the CPU), its AdamW state and
        its counters."""
        return {
            "head": {k: v.detach().to("cpu", copy=True) for k, v in self.head.state_dict().items()},
            "optim": self.trainer.opt.state_dict(),
            "steps": self.trainer.steps,
            "skipped": self.trainer.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The head as a checkpoint saved it (``state_dict``)."""
        try:
            self.head.load_state_dict(state["head"])
            self.trainer.opt.load_state_dict(state["optim"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise TrainError(f"the checkpoint's draft head does not fit this run's head: {e}") from e
        self.trainer.steps, self.trainer.skipped = int(state["steps"]), int(state["skipped"])

    def write_beside(self, version_dir: Path) -> None:
        save_head(self.head, version_dir / HEAD_DIR, {"online_steps": self.trainer.steps})

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        for name, t in self.head.vllm_state_dict().items():
            yield HEAD_PREFIX + name, t


def served_head(cfg: DraftingConfig, weights: Path) -> DraftingConfig:
    """``cfg`` for an engine (re)started on the policy dir ``weights``: an online head's
    version dir holds the head trained with it (``draft_head/``), served instead of the
    starting head; any other dir (the base, a frozen head's versions) leaves ``cfg`` as is."""
    own = weights / HEAD_DIR
    if cfg.method != "eagle" or not (own / HEAD_FILE).is_file():
        return cfg
    return cfg.model_copy(update={"head": str(own)})


def online_head(
    cfg: DraftingConfig, trainer: Any, publisher: WeightPublisher, resumed: dict[str, Any] | None = None
) -> OnlineHead | None:
    """The run's online head, hooked into ``publisher`` so each version carries it (disk: a
    ``draft_head/`` dir beside the weights; memory: its tensors after the policy's, under
    ``HEAD_PREFIX``); None without eagle drafting or with a frozen head. ``resumed``: the
    head's state from the checkpoint a resumed run loaded (``OnlineHead.state_dict``)."""
    if cfg.method != "eagle" or not cfg.online:
        if resumed is not None:
            log.warning("the checkpoint holds an online draft head; this run has none, so it is unused")
        return None
    model = getattr(trainer, "model", None)
    if model is None or not hasattr(model, "model"):
        raise ConfigError("engine.drafting.online with method eagle needs a transformers Llama policy")
    head = OnlineHead(cfg, lambda: trainer.model)
    if resumed is not None:
        head.load_state_dict(resumed)
        log.info("draft head resumed at its step %d", head.trainer.steps)
    elif not head.trainer.opt.state:
        log.warning(
            "the draft head %s has no %s: its first online step is a fresh AdamW's (every weight "
            "moves by lr), which can undo its training (docs/drafting.md)",
            cfg.head,
            HEAD_OPTIM,
        )
    if publisher.mode == "disk":
        publisher.beside = head.write_beside
    elif isinstance(publisher.links, MemoryLinks):
        publisher.links.extra = head.named_weights
    else:  # checked before the run started (``check_eagle_publish``); kept against a bypass
        check_eagle_publish(cfg, "memory")
        raise ConfigError("engine.drafting.online with method eagle: this publish cannot carry the head")
    return head
