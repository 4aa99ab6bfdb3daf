"""N data-parallel trainer ranks from one run: rank 0 in this process, ranks 1..N-1 spawned.

``trainer.world_size: N`` makes ``rollyard train`` build a ``RankGroup`` instead of a single
``Trainer``; it has the same face (``model``, ``train_step``, ``save``, ``load``), so the loop does
not know. Each rank's model is wrapped by FSDP2 (``train/sharding.py``; gloo on CPU, nccl on
GPUs). Every command that runs collectives (a step, a checkpoint save or load, gathering the
weights to publish) is sent to the workers first, then rank 0 does its own part, then the
workers' answers are read: all ranks meet in the same collectives in the same order.

``model`` is what gets published: the full weights gathered on rank 0 after each step (a plain
CPU model; with FSDP2 no rank holds them otherwise). With ``parallel.kind: replicate`` every rank
holds whole weights, and the workers' checksums are compared with rank 0's after every step.
A world of one is allowed: a one-rank group, which is how bf16 mixed precision runs on one GPU.
"""

from __future__ import annotations

import contextlib
import functools
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
from rollyard.train.checkpoint import stage_dir
from rollyard.train.distributed import DataParallel, leave_group
from rollyard.train.sharding import local
from rollyard.train.trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)

ModelFactory = Callable[[], torch.nn.Module]


def weights_digest(model: torch.nn.Module) -> str:
    """A checksum of every parameter's bytes on this rank (its shards under FSDP2)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(local(p).detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _init(rank: int, world: int, port: int, backend: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _serve(trainer: Trainer, cmd: str, arg: Any) -> None:
    """A worker's part of one command (the same calls, in the same order, as rank 0's)."""
    if cmd == "step":
        trainer.train_step(trainer.parallel.shard([Sample.model_validate(s) for s in arg]))
        trainer.weights()
    elif cmd == "save":
        trainer.write_shards(Path(arg))
    elif cmd == "load":
        trainer.load(arg)
        trainer.weights()
    elif cmd == "gather":
        trainer.weights()
    else:
        raise TrainError(f"unknown rank command {cmd!r}")


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    make_model: ModelFactory,
    config: dict[str, Any],
    pipe: Any,
) -> None:
    """A rank > 0: the same trainer, fed the same commands; answers each with its weights' digest."""
    torch.set_num_threads(1)
    _init(rank, world, port, backend)
    trainer = Trainer(
        make_model(), TrainConfig.model_validate(config), parallel=DataParallel(rank, world, True)
    )
    try:
        while True:
            cmd, arg = pipe.recv()
            if cmd == "stop":
                break
            try:
                _serve(trainer, cmd, arg)
                pipe.send(("ok", weights_digest(trainer.model)))
            except Exception as e:  # reported to rank 0, which raises it
                pipe.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        leave_group()


class RankGroup:
    """Rank 0's trainer plus the worker ranks; ``close`` stops them."""

    def __init__(self, make_model: ModelFactory, config: TrainConfig, world: int) -> None:
        if world < 1:
            raise TrainError("a rank group needs world_size >= 1")
        self.world = world
        self.config = config
        backend = "nccl" if torch.cuda.is_available() else "gloo"
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
        self.trainer = Trainer(make_model(), config, parallel=DataParallel(0, world, True))
        self._published: Any = None  # the full weights of the last step or load
        log.info("trainer ranks up world=%d backend=%s parallel=%s", world, backend, config.parallel.kind)

    @property
    def model(self) -> torch.nn.Module:
        """The full weights to publish (gathered from every rank's shards)."""
        if self._published is None:
            self._run("gather", None, lambda: None)  # ``_run`` gathers after every command
        return self._published

    def _run(self, cmd: str, arg: Any, mine: Callable[[], Any], *, compare: bool = False) -> Any:
        """Workers first, then rank 0's ``mine``, then the workers' answers (errors raised here)."""
        for p in self._pipes:
            p.send((cmd, arg))
        result = mine()
        if cmd != "save":  # the workers gather too (``_serve``)
            self._published = self.trainer.weights()
        answers = [p.recv() for p in self._pipes]
        errors = [a[1] for a in answers if a[0] == "error"]
        if errors:
            raise TrainError(f"a trainer rank failed: {errors[0]}")
        if compare and self.replicated:
            mine_digest = weights_digest(self.trainer.model)
            if any(a[1] != mine_digest for a in answers):
                raise TrainError("trainer ranks disagree on the weights after the step")
        return result

    @property
    def replicated(self) -> bool:
        """Every rank holds whole weights (``parallel.kind: replicate``), so their digests compare."""
        return self.config.parallel.kind == "replicate"

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        self.trainer.check(samples)  # here, so no rank fails alone half-way into a collective
        batch = [s.model_dump(mode="json") for s in samples]
        step = functools.partial(self.trainer.train_step, self.trainer.parallel.shard(samples))
        metrics: dict[str, float] = self._run("step", batch, step, compare=True)
        metrics["ranks"] = float(self.world)
        if self.replicated:
            metrics["ranks_in_sync"] = 1.0  # checked above: every rank holds the published weights
        return metrics

    def save(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        staged = stage_dir(Path(path))
        self._run("save", str(staged), functools.partial(self.trainer.write_shards, staged))
        return self.trainer.commit(staged, path, extra_state)

    def load(self, path: str | Path) -> dict[str, Any]:
        extra: dict[str, Any] = self._run("load", str(path), functools.partial(self.trainer.load, path))
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
