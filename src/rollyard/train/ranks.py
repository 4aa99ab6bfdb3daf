"""N data-parallel trainer ranks from one run: rank 0 in this process, ranks 1..N-1 spawned.

``trainer.world_size: N`` makes ``rollyard train`` build a ``RankGroup`` instead of a single
``Trainer``; it has the same face (``model``, ``train_step``, ``save``, ``load``), so the loop does
not know. Each step every rank gets the whole batch over a pipe and trains its contiguous shard
(``DataParallel.shard``); gradients are summed with torch.distributed (gloo on CPU, nccl when the
model is on a GPU), so every rank applies the same update. After each step the workers report a
checksum of their weights and rank 0 checks it against its own: the weights it publishes are
every rank's weights, or the step fails loudly.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollyard.core.errors import TrainError
from rollyard.core.net import free_port
from rollyard.core.sample import Sample
from rollyard.train.distributed import DataParallel, leave_group
from rollyard.train.trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)

ModelFactory = Callable[[], torch.nn.Module]


def weights_digest(model: torch.nn.Module) -> str:
    """A checksum of every parameter's bytes (the same weights give the same digest)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _init(rank: int, world: int, port: int, backend: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    make_model: ModelFactory,
    config: dict[str, Any],
    pipe: Any,
) -> None:
    """A rank > 0: the same trainer, fed the same batches; answers each with its weights' digest."""
    torch.set_num_threads(1)
    _init(rank, world, port, backend)
    trainer = Trainer(make_model(), TrainConfig.model_validate(config), parallel=DataParallel(rank, world))
    try:
        while True:
            cmd, arg = pipe.recv()
            if cmd == "stop":
                break
            try:
                if cmd == "step":
                    samples = [Sample.model_validate(s) for s in arg]
                    trainer.train_step(trainer.parallel.shard(samples))
                elif cmd == "load":
                    trainer.load(arg)
                pipe.send(("ok", weights_digest(trainer.model)))
            except Exception as e:  # reported to rank 0, which raises it
                pipe.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        leave_group()


class RankGroup:
    """Rank 0's trainer plus the worker ranks; ``close`` stops them."""

    def __init__(self, make_model: ModelFactory, config: TrainConfig, world: int) -> None:
        if world < 2:
            raise TrainError("a rank group needs world_size >= 2")
        self.world = world
        model = make_model()
        backend = "nccl" if next(model.parameters()).is_cuda else "gloo"
        port = free_port()
        ctx = mp.get_context("spawn")
        self._pipes = []
        self._procs = []
        for rank in range(1, world):
            here, there = ctx.Pipe()
            args = (rank, world, port, backend, make_model, config.model_dump(mode="json"), there)
            proc = ctx.Process(target=_worker, args=args, daemon=True, name=f"rollyard-rank{rank}")
            proc.start()
            self._pipes.append(here)
            self._procs.append(proc)
        _init(0, world, port, backend)
        self.trainer = Trainer(model, config, parallel=DataParallel(0, world))
        log.info("trainer ranks up world=%d backend=%s", world, backend)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    def _ask(self, cmd: str, arg: Any) -> list[str]:
        for p in self._pipes:
            p.send((cmd, arg))
        return [p.recv() for p in self._pipes]

    def _check(self, answers: list[Any]) -> None:
        errors = [a[1] for a in answers if a[0] == "error"]
        if errors:
            raise TrainError(f"a trainer rank failed: {errors[0]}")
        mine = weights_digest(self.trainer.model)
        if any(a[1] != mine for a in answers):
            raise TrainError("trainer ranks disagree on the weights after the step")

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        batch = [s.model_dump(mode="json") for s in samples]
        for p in self._pipes:
            p.send(("step", batch))
        metrics = self.trainer.train_step(self.trainer.parallel.shard(samples))
        self._check([p.recv() for p in self._pipes])
        metrics["ranks"] = float(self.world)
        metrics["ranks_in_sync"] = 1.0  # checked above: every rank holds the published weights
        return metrics

    def save(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        return self.trainer.save(path, extra_state)

    def load(self, path: str | Path) -> dict[str, Any]:
        extra = self.trainer.load(path)
        self._check(self._ask("load", str(path)))  # same weights and optimizer on every rank
        return extra

    def close(self) -> None:
        for p in self._pipes:
            with contextlib.suppress(BrokenPipeError, OSError):
                p.send(("stop", None))
        leave_group()  # with the workers, which leave on "stop"
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
