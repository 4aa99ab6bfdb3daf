"""Rollout workers on Ray: each actor owns a sandbox provider and runs agents + evaluation.

The orchestrator keeps the gateway, program table and trainer; a worker gets a task directory
(on a shared filesystem), the program's key and the gateway URL, and returns an
``EpisodeResult``. ``ray.address: local`` starts a private local cluster (its session files in
a short temp dir named in ``RUN_DIR/logs/ray_temp_dir.txt``, removed at the end); any other
address joins an existing cluster (``ray start --head`` / ``ray start --address=...``; the
gateway must then listen on an address the workers reach, ``gateway.host: 0.0.0.0``, and the
workers are handed ``gateway.advertise``, by default this node's first non-loopback address).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollyard.agents.blackbox import BlackBoxRunner
from rollyard.agents.blackbox.relay import NodeRelay
from rollyard.agents.loop import AgentConfig
from rollyard.core.errors import WorkerLost
from rollyard.core.net import is_loopback
from rollyard.core.program import Program
from rollyard.rollout.config import Config
from rollyard.rollout.episode import EpisodeResult, act_and_evaluate
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)


class RolloutWorker:
    """The actor body: sandboxes are made here, on the worker's node; a black-box agent's sandbox
    reaches the gateway through this node's relay (``NodeRelay``)."""

    def __init__(self, provider: str) -> None:
        self.relay = NodeRelay()
        if provider == "bwrap":
            from rollyard.sandbox.bwrap import BwrapProvider

            self.provider: Any = BwrapProvider()
        else:
            from rollyard.sandbox.local import LocalProvider

            self.provider = LocalProvider(unsafe=True)

    async def run(
        self,
        task_root: str,
        api_key: str,
        base_url: str,
        agent: dict[str, Any] | BlackBoxRunner,
        timeout_s: float,
    ) -> dict[str, Any]:
        from rollyard.tasks import load_task, prepare
        from rollyard.tasks.sandboxing import sandbox_spec

        task = load_task(task_root)
        if isinstance(agent, BlackBoxRunner):  # its sandbox's door: this node's relay to the gateway
            runner: AgentConfig | BlackBoxRunner = agent.through(await self.relay.socket_for(base_url))
            spec = runner.spec(sandbox_spec(task, self.provider))
            sb = await prepare(task, self.provider, spec=spec)
        else:
            runner = AgentConfig.model_validate(agent)
            sb = await prepare(task, self.provider)
        try:
            res = await act_and_evaluate(
                task,
                sb,
                self.provider,
                base_url=base_url,
                api_key=api_key,
                agent=runner,
                timeout_s=timeout_s,
            )
        finally:
            await sb.close()
        res.outcome.details["node"] = self.node_ip()  # where the agent and its sandbox ran
        return res.model_dump(mode="json")

    async def aclose(self) -> None:
        """Close this node's relays (their sockets and directory)."""
        await self.relay.aclose()

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())


@contextlib.contextmanager
def ray_session(cfg: Config, run_dir: Path) -> Iterator[None]:
    """Connect to ``ray.address`` for the whole run (engines and rollout workers are its actors).

    ``local`` starts a private cluster whose session lives in a short temp dir (Ray's socket
    paths must stay under 107 bytes), named in ``RUN_DIR/logs/ray_temp_dir.txt`` and removed at
    the end; any other address joins a running cluster. Nothing when the run uses no Ray."""
    if cfg.ray.address is None:
        yield
        return
    import ray

    if ray.is_initialized():  # a caller's session (tests, benches): theirs to end
        yield
        return
    tmp: Path | None = None
    if cfg.ray.address == "local":
        tmp = Path(tempfile.mkdtemp(prefix="ryray-", dir="/tmp"))
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / "ray_temp_dir.txt").write_text(f"{tmp}\n")
        engines = cfg.engine.count * cfg.engine.cpus_per_engine if cfg.engines_on_ray else 0
        ranks = (cfg.trainer.world_size - 1) * cfg.trainer.cpus_per_rank if cfg.ranks_on_ray else 0
        ray.init(
            num_cpus=max(2, math.ceil(cfg.ray.workers * cfg.ray.num_cpus_per_worker + engines + ranks)),
            _temp_dir=str(tmp),
            include_dashboard=False,
            log_to_driver=False,
        )
    else:
        ray.init(address=cfg.ray.address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class RayRunner:
    """``ProgramRunner`` over a set of ``RolloutWorker`` actors (inside ``ray_session``), round-robin.

    A worker whose node is lost fails its program with ``WorkerLost``: the run stops with that
    error (its in-flight groups are re-issued on ``--resume``, none is dropped)."""

    remote = True

    def __init__(self, cfg: Config) -> None:
        import ray

        if cfg.ray.address != "local" and is_loopback(cfg.gateway.host) and not cfg.gateway.advertise:
            log.warning(
                "gateway.host %s is loopback: Ray workers on other nodes cannot reach it "
                "(bind gateway.host: 0.0.0.0 and set gateway.advertise to this node's address)",
                cfg.gateway.host,
            )
        actor = ray.remote(num_cpus=cfg.ray.num_cpus_per_worker)(RolloutWorker)
        self.workers = [actor.remote(cfg.sandbox.provider) for _ in range(cfg.ray.workers)]
        self._next = itertools.cycle(self.workers)
        self.timeout_s = cfg.agent.timeout_s
        log.info("ray rollout workers=%d address=%s", len(self.workers), cfg.ray.address)

    async def run(
        self, task: Task, program: Program, base_url: str, agent: AgentConfig | BlackBoxRunner
    ) -> EpisodeResult:
        import ray

        worker = next(self._next)
        sent = agent if isinstance(agent, BlackBoxRunner) else agent.model_dump(mode="json")
        try:
            out = await worker.run.remote(str(task.root), program.api_key, base_url, sent, self.timeout_s)
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(
                f"the Ray rollout worker running program {program.id} is gone (its node died?): "
                f"{type(e).__name__}. The run stops; resume it with rollyard train --resume RUN_DIR"
            ) from None
        return EpisodeResult.model_validate(out)

    def nodes(self) -> list[str]:
        import ray

        return list(ray.get([w.node.remote() for w in self.workers]))

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # a dead worker has nothing left to close
            ray.get([w.aclose.remote() for w in self.workers], timeout=10)
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w)
