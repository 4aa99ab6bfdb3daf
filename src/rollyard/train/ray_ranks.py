"""Trainer ranks 1..N-1 as Ray actors reserved through one placement group (``trainer.placement: ray``).

Rank 0 stays in the run's process (it publishes); the workers are ``RankActor`` s, one per bundle
of a single placement group (``{CPU: trainer.cpus_per_rank, GPU: 1 where CUDA is}``, strategy
``trainer.ray_strategy``), so the whole world is reserved at once or not at all. On GPUs the
group also holds a bundle ``{GPU: 1}`` pinned to the head node for rank 0: Ray then hands that GPU
to no other actor (an engine or a rank on cuda:0 beside rank 0 would make nccl fail with
"Duplicate GPU detected"), and rank 0 uses the GPU id Ray reports for it (untested: no GPU here).
The workers get the same commands as spawned ranks (``ranks.answer``) as Ray method calls. The
rendezvous is rank 0's node address, never loopback, and every rank binds gloo to the interface
it reaches rank 0 by (gloo otherwise takes the hostname's address, often 127.0.1.1: see
``engines/gloo_pair.py``). A rank whose actor or node is lost fails the step with a
``TrainError``: the run stops and ``rollyard train --resume RUN_DIR`` continues from its last
checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from rollyard.core.errors import TrainError
from rollyard.core.net import interface_addresses
from rollyard.engines.gloo_pair import route_address
from rollyard.train.distributed import leave_group
from rollyard.train.ranks import STOP_UNJOINED_S, ModelFactory, RayPlacement, answer, rank_env, start_rank

log = logging.getLogger(__name__)

STOP_S = 60.0  # for the actors to leave the group before they are killed


def head_address() -> str:
    """Rank 0's rendezvous address: this node's address as Ray knows it (other nodes reach it)."""
    import ray

    return str(ray.util.get_node_ip_address())


@contextlib.contextmanager
def gloo_interface(address: str) -> Iterator[None]:
    """While it lasts, gloo groups made in this process (``init_process_group`` and FSDP's
    meshes) use the interface holding ``address``; the variable is then restored, so engines,
    sandboxes and later groups do not inherit it. A ``GLOO_SOCKET_IFNAME`` already set is kept."""
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    if before is None:
        bind_gloo(address)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)


def bind_gloo(address: str) -> None:
    """Make gloo's default device use the interface holding ``address`` in this process (a rank
    actor's own); a ``GLOO_SOCKET_IFNAME`` already set is kept. No such interface: gloo picks
    the hostname's address, which other nodes may not reach: warned."""
    for name, ip in interface_addresses().items():
        if ip == address:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
            return
    log.warning(
        "no network interface holds %s (the address Ray gives this node): gloo binds the "
        "hostname's address, which other ranks may not reach; set GLOO_SOCKET_IFNAME",
        address,
    )


def cuda_index(gpu_id: str, visible: str | None) -> int:
    """This process's CUDA index of the GPU Ray calls ``gpu_id``: its place in our own
    ``CUDA_VISIBLE_DEVICES`` when that is set, else the id itself (torch sees every GPU)."""
    if not visible:
        return int(gpu_id)
    ids = [v.strip() for v in visible.split(",")]
    if gpu_id not in ids:
        raise TrainError(
            f"Ray reserved GPU {gpu_id} for trainer rank 0, but this process sees only "
            f"CUDA_VISIBLE_DEVICES={visible}: unset it, or start Ray's head node with the same set"
        )
    return ids.index(gpu_id)


def _bundle_gpu() -> str:
    """Run in rank 0's bundle: the GPU id Ray reserved there."""
    import ray

    return str(ray.get_gpu_ids()[0])


def _why(e: Exception) -> str:
    """A Ray error in one line: a task's own exception, else the last line of an actor's death
    report (``ModuleNotFoundError: ...`` when the node lacks the code, ``ray.kill``, ...)."""
    cause = getattr(e, "cause", None)  # a task error's own exception; its str is a traceback
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1][:300]}" if lines else type(e).__name__


class RankActor:
    """One worker rank on whatever node Ray placed its bundle: ``join``, then commands, then ``stop``."""

    def __init__(
        self,
        rank: int,
        world: int,
        addr: str,
        port: int,
        backend: str,
        make_model: ModelFactory,
        config: dict[str, Any],
        timeout_s: float,
        threads: int,
    ) -> None:
        self.args = (rank, world, addr, port, backend, make_model, config, timeout_s)
        self.threads = threads  # the CPUs its bundle reserved (``trainer.cpus_per_rank``)
        self.trainer: Any = None

    def join(self) -> tuple[str, str]:
        """Join rank 0's group (collective with its ``Trainer``); answers with the address this
        node reaches rank 0 from (which node Ray placed the rank on)."""
        rank, world, addr, port = self.args[:4]
        own = route_address(addr)
        bind_gloo(own)
        rank_env(rank, world, addr, port, local_rank=0)  # Ray gives each actor its own GPU as cuda:0
        self.trainer = start_rank(*self.args, threads=self.threads)
        return ("ok", own)

    def run(self, cmd: str, arg: Any) -> tuple[str, str]:
        return answer(self.trainer, cmd, arg)

    def stop(self) -> None:
        leave_group()


class RayWorkers:
    """The actors and their placement group, behind ``ranks.Workers``' face."""

    kind = "ray"

    def __init__(
        self,
        placement: RayPlacement,
        world: int,
        addr: str,
        port: int,
        backend: str,
        make_model: ModelFactory,
        config: dict[str, Any],
        timeout_s: float,
    ) -> None:
        from ray.util.placement_group import placement_group

        gpu = {"GPU": 1} if backend == "nccl" else {}
        bundles = [{"CPU": placement.cpus_per_rank, **gpu} for _ in range(world - 1)]
        head = [{"GPU": 1, f"node:{addr}": 0.001}] if gpu else []  # rank 0's GPU, on this node
        self.group = placement_group(head + bundles, strategy=placement.strategy)
        self.actors: list[Any] = []
        self._pending: list[tuple[int, Any]] = []
        self.joined = False  # every actor's join answered (until then they may wait in the rendezvous)
        self.head_gpu: int | None = None  # rank 0's CUDA index (None: CPU, or the default device)
        self.nodes: set[str] = set()  # the addresses the workers joined from (their nodes)
        try:  # whatever fails (no room, an actor's arguments that cannot be sent) leaves nothing
            self._start(placement, world, len(head), (addr, port, backend, make_model, config, timeout_s))
        except BaseException:
            self.stop()
            raise

    def _start(self, placement: RayPlacement, world: int, heads: int, args: tuple[Any, ...]) -> None:
        """Wait for the bundles, find rank 0's GPU (``heads``: 1 on GPUs), start and join the actors."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not self.group.wait(timeout_seconds=placement.timeout_s):
            bundle = {"CPU": placement.cpus_per_rank, **({"GPU": 1} if heads else {})}
            raise TrainError(
                f"Ray could not reserve {world - 1} trainer rank bundle(s) {bundle} "
                f"{'and one GPU on this node for rank 0 ' if heads else ''}"
                f"({placement.strategy}) within {placement.timeout_s:.0f} s: see `ray status`"
            )
        if heads:
            where = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=0)
            probe = ray.remote(_bundle_gpu).options(scheduling_strategy=where, num_cpus=0, num_gpus=1)
            gpu_id = ray.get(probe.remote(), timeout=placement.timeout_s)
            self.head_gpu = cuda_index(gpu_id, os.environ.get("CUDA_VISIBLE_DEVICES"))
        remote = ray.remote(RankActor)
        threads = max(1, int(placement.cpus_per_rank))
        for rank in range(1, world):
            index = rank - 1 + heads  # rank 0's GPU bundle comes first
            where = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
            options = dict(num_cpus=placement.cpus_per_rank, num_gpus=heads, max_restarts=0)
            actor = remote.options(scheduling_strategy=where, **options).remote(rank, world, *args, threads)
            self.actors.append(actor)
        self._pending = [(rank, a.join.remote()) for rank, a in enumerate(self.actors, start=1)]

    def send(self, cmd: str, arg: Any) -> None:
        self._pending = [(rank, a.run.remote(cmd, arg)) for rank, a in enumerate(self.actors, start=1)]

    def _get(self, rank: int, ref: Any) -> tuple[str, str]:
        import ray

        try:
            return tuple(ray.get(ref))  # type: ignore[return-value]
        except ray.exceptions.RayError as e:
            raise TrainError(
                f"trainer rank {rank} (a Ray actor) failed or is lost ({_why(e)}): the run stops; "
                "continue it from its last checkpoint with `rollyard train --resume RUN_DIR`"
            ) from None

    def answers(self) -> list[tuple[str, str]]:
        pending, self._pending = self._pending, []
        out = [self._get(rank, ref) for rank, ref in pending]
        if not self.joined:  # the first answers are the joins: which node each rank runs on
            self.joined = True
            self.nodes = {node for status, node in out if status == "ok"}
            log.info("trainer rank actors joined nodes=%s", sorted(self.nodes))
        return out

    def check(self, timeout_s: float) -> None:
        import ray

        refs = [ref for _, ref in self._pending]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for rank, ref in self._pending:
            if ref in done:
                self._get(rank, ref)

    def stop(self) -> None:
        """The actors leave the group with rank 0, are killed, and the placement group removed.
        Actors that have not joined (a failed start) may be blocked in the rendezvous, where a
        ``stop`` call would queue behind ``join``: they are killed at once."""
        import ray
        from ray.util.placement_group import remove_placement_group

        refs = [a.stop.remote() for a in self.actors] if self.joined else []
        if not self.joined:
            for a in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(a)
            leave_group(timeout_s=STOP_UNJOINED_S)  # rank 0 may be in the group, its peers gone
        if refs:
            leave_group()
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(refs, num_returns=len(refs), timeout=STOP_S)
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone with its node
                ray.kill(a)
        self.actors = []
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)
