"""N data-parallel trainer ranks from one run: rank 0 in this process, ranks 1..N-1 spawned on
this host (``PipeWorkers``) or Ray actors in one placement group (``ray_ranks.RayWorkers``).

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
import multiprocessing.connection as mp_connection
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from rollyard.core.errors import TrainError
from rollyard.core.net import free_port
from rollyard.core.sample import Sample
from rollyard.train.checkpoint import stage_dir
from rollyard.train.distributed import DataParallel, leave_group
from rollyard.train.sharding import local, rank_device
from rollyard.train.trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)

ModelFactory = Callable[[], torch.nn.Module]
LOOPBACK = "127.0.0.1"  # the rendezvous of ranks that all run on this host
JOIN_S = 600.0  # for every worker rank to load its model and dial rank 0's store
CHECK_S = 10.0  # how long rank 0, whose collective failed, waits to hear which rank was lost
STOP_UNJOINED_S = 2.0  # rank 0's last wait on workers killed before they joined
COLLECTIVE_S = 600.0  # a collective's timeout (``trainer.collective_timeout_s``; torch's is 30 min)


def weights_digest(model: torch.nn.Module) -> str:
    """A checksum of every parameter's bytes on this rank (its shards under FSDP2)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(local(p).detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def rank_env(rank: int, world: int, addr: str, port: int, local_rank: int) -> None:
    """torchrun's variables in a worker rank's own process, so code reading them (``rank_device``
    reads LOCAL_RANK) sees what a torchrun launch gives. Never set in rank 0: the run's process
    also starts engines, which must not inherit a trainer rank's identity."""
    env = {
        "RANK": rank,
        "WORLD_SIZE": world,
        "LOCAL_RANK": local_rank,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }
    os.environ.update({k: str(v) for k, v in env.items()})


def rank_store(rank: int, world: int, addr: str, port: int) -> dist.TCPStore:
    """The group's store: rank 0 serves it (before any worker starts), the others dial it."""
    return dist.TCPStore(
        addr, port, world, is_master=rank == 0, wait_for_workers=False, timeout=timedelta(seconds=JOIN_S)
    )


def _init(
    rank: int, world: int, store: dist.TCPStore, backend: str, timeout_s: float, device: int | None = None
) -> None:
    """Join the group, whose collectives fail after ``timeout_s`` when a rank does not meet them;
    ``device``: the CUDA index Ray reserved for rank 0 (else ``rank_device``)."""
    if backend == "nccl":
        torch.cuda.set_device(rank_device() if device is None else device)
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def start_rank(
    rank: int,
    world: int,
    addr: str,
    port: int,
    backend: str,
    make_model: ModelFactory,
    config: dict[str, Any],
    timeout_s: float = COLLECTIVE_S,
    threads: int = 1,
) -> Trainer:
    """A rank > 0 builds its model, says it is ready, and joins the group (collective with rank
    0's ``Trainer``). What can fail alone (the model's files) fails before the rendezvous, where
    rank 0 sees this rank gone rather than waiting in a collective for it. ``threads``: torch's
    intra-op threads, 1 for ranks sharing this host, the CPUs Ray reserved for a rank actor."""
    torch.set_num_threads(threads)
    model = make_model()
    store = rank_store(rank, world, addr, port)
    store.set(f"ready{rank}", "1")
    _init(rank, world, store, backend, timeout_s)
    return Trainer(model, TrainConfig.model_validate(config), parallel=DataParallel(rank, world, True))


def answer(trainer: Trainer, cmd: str, arg: Any) -> tuple[str, str]:
    """A worker's part of one command (the same calls, in the same order, as rank 0's), answered
    ``("ok", digest of its weights)`` or ``("error", what failed)``: every worker kind's protocol."""
    try:
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
        return ("ok", weights_digest(trainer.model))
    except Exception as e:  # reported to rank 0, which raises it
        return ("error", f"{type(e).__name__}: {e}")


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    make_model: ModelFactory,
    config: dict[str, Any],
    timeout_s: float,
    pipe: Any,
) -> None:
    """A spawned rank > 0: the same trainer, fed the same commands over a pipe until "stop"."""
    rank_env(rank, world, LOOPBACK, port, rank)
    trainer = start_rank(rank, world, LOOPBACK, port, backend, make_model, config, timeout_s)
    pipe.send(("ok", "joined"))
    try:
        while True:
            cmd, arg = pipe.recv()
            if cmd == "stop":
                break
            pipe.send(answer(trainer, cmd, arg))
    finally:
        leave_group()


class Workers(Protocol):
    """Ranks 1..N-1, however they were started: fed commands, answering each with a digest."""

    kind: str  # "local" or "ray": where they run (reported in the trainer phase and metrics)
    head_gpu: int | None  # rank 0's CUDA index when the workers reserved one for it (Ray)

    def send(self, cmd: str, arg: Any) -> None: ...

    def answers(self) -> list[tuple[str, str]]:
        """Each rank's answer to the last command; a lost rank raises ``TrainError``."""
        ...

    def check(self, timeout_s: float) -> None:
        """Raise ``TrainError`` naming a lost rank, if one is (waiting up to ``timeout_s`` to know)."""
        ...

    def stop(self) -> None: ...


class PipeWorkers:
    """Ranks spawned on this host, one pipe each; rendezvous on loopback."""

    kind = "local"
    head_gpu = None  # rank 0 takes cuda:0, the workers cuda:RANK

    def __init__(
        self,
        world: int,
        port: int,
        backend: str,
        make_model: ModelFactory,
        config: dict[str, Any],
        timeout_s: float,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.joined = False  # every worker answered "joined" (until then they may wait in the rendezvous)
        self._pipes: list[Any] = []
        self._procs: list[Any] = []
        for rank in range(1, world):
            here, there = ctx.Pipe()
            args = (rank, world, port, backend, make_model, config, timeout_s, there)
            proc = ctx.Process(target=_worker, args=args, daemon=True, name=f"rollyard-rank{rank}")
            proc.start()
            self._pipes.append(here)
            self._procs.append(proc)

    def send(self, cmd: str, arg: Any) -> None:
        for p in self._pipes:
            p.send((cmd, arg))

    def answers(self) -> list[tuple[str, str]]:
        out = []
        for rank, p in enumerate(self._pipes, start=1):
            try:
                out.append(p.recv())
            except (EOFError, OSError):
                raise TrainError(f"trainer rank {rank} is gone (its process exited)") from None
        self.joined = True
        return out

    def check(self, timeout_s: float) -> None:
        # until a worker answers (alive) or exits, so a rank that did not die costs no wait
        heard = mp_connection.wait([*self._pipes, *(p.sentinel for p in self._procs)], timeout=timeout_s)
        for rank, proc in enumerate(self._procs, start=1):
            proc.join(timeout=0.2 if heard else 0)  # a closed pipe: its process is exiting
            if not proc.is_alive():
                raise TrainError(f"trainer rank {rank} is gone (exit code {proc.exitcode})")

    def stop(self) -> None:
        """Joined workers leave the group on "stop"; before that (a failed start) they may be
        blocked in the rendezvous, where they never read it: killed at once."""
        if not self.joined:
            for proc in self._procs:
                proc.kill()
            leave_group(timeout_s=STOP_UNJOINED_S)  # rank 0 may be in the group, its peers gone
            for proc in self._procs:
                proc.join(timeout=STOP_UNJOINED_S)
            return
        for p in self._pipes:
            with contextlib.suppress(BrokenPipeError, OSError):
                p.send(("stop", None))
        leave_group()  # with the workers, which leave on "stop"
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def _serve_store(world: int, addr: str) -> tuple[int, dist.TCPStore]:
    """Rank 0's store on a free port of ``addr`` (another process may take a port between
    ``free_port`` and the bind: retried)."""
    for _ in range(4):
        with contextlib.suppress(RuntimeError):  # the port was taken meanwhile
            port = free_port()
            return port, rank_store(0, world, addr, port)
    port = free_port()
    return port, rank_store(0, world, addr, port)


@dataclass(frozen=True)
class RayPlacement:
    """Ranks 1..N-1 as Ray actors in one placement group (``trainer.placement: ray``)."""

    cpus_per_rank: float = 1.0
    strategy: str = "PACK"
    timeout_s: float = 300.0  # for the group's bundles to be reserved (a node with room to join)


class RankGroup:
    """Rank 0's trainer plus the worker ranks (spawned here, or Ray actors); ``close`` stops them."""

    def __init__(
        self,
        make_model: ModelFactory,
        config: TrainConfig,
        world: int,
        ray: RayPlacement | None = None,
        *,
        collective_timeout_s: float = COLLECTIVE_S,
    ) -> None:
        if world < 1:
            raise TrainError("a rank group needs world_size >= 1")
        self.world = world
        self.config = config
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        spec = config.model_dump(mode="json")
        self._workers: Workers
        bound: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if ray is None or world == 1:
            addr = LOOPBACK
            port, store = _serve_store(world, addr)
            self._workers = PipeWorkers(world, port, backend, make_model, spec, collective_timeout_s)
        else:
            from rollyard.train.ray_ranks import RayWorkers, gloo_interface, head_address

            addr = head_address()  # routable: ranks may sit on other nodes
            bound = gloo_interface(addr)  # for rank 0's groups only, not the run's other children
            port, store = _serve_store(world, addr)
            args = (backend, make_model, spec, collective_timeout_s)
            self._workers = RayWorkers(ray, world, addr, port, *args)
        try:
            model = make_model()
            self._wait_ready(store)
            with bound:  # every group rank 0 makes: the default one, FSDP's meshes
                _init(0, world, store, backend, collective_timeout_s, self._workers.head_gpu)
                self.trainer = Trainer(model, config, parallel=DataParallel(0, world, True))
            self._workers.answers()  # each worker's "joined"
        except BaseException:
            self._workers.stop()
            raise
        self._published: Any = None  # the full weights of the last step or load
        log.info(
            "trainer ranks up world=%d backend=%s parallel=%s placement=%s rendezvous=%s:%d",
            world, backend, config.parallel.kind, self._workers.kind, addr, port,
        )  # fmt: skip

    def _wait_ready(self, store: dist.TCPStore) -> None:
        """Until every worker has its model and dialled the store; a worker that dies first (a
        missing model dir on its node, an actor that could not start) fails here, not in a hang."""
        keys = [f"ready{r}" for r in range(1, self.world)]
        deadline = time.monotonic() + JOIN_S
        while not store.check(keys):
            self._workers.check(timeout_s=0.5)
            if time.monotonic() > deadline:
                raise TrainError(f"trainer ranks did not join within {JOIN_S:.0f} s")

    @property
    def placement(self) -> str:
        """Where ranks 1..N-1 run: ``local`` (spawned on this host) or ``ray`` (actors)."""
        return self._workers.kind

    @property
    def model(self) -> torch.nn.Module:
        """The full weights to publish (gathered from every rank's shards)."""
        if self._published is None:
            self._run("gather", None, lambda: None)  # ``_run`` gathers after every command
        return self._published

    def _run(self, cmd: str, arg: Any, mine: Callable[[], Any], *, compare: bool = False) -> Any:
        """Workers first, then rank 0's ``mine``, then the workers' answers (errors raised here)."""
        self._workers.send(cmd, arg)
        try:
            result = mine()
            if cmd != "save":  # the workers gather too (``answer``)
                self._published = self.trainer.weights()
        except Exception:
            self._workers.check(timeout_s=CHECK_S)  # a lost rank broke the collective: say which
            raise
        answers = self._workers.answers()
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
        metrics["ranks_on_ray"] = float(self.placement == "ray")
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
        self._workers.stop()
