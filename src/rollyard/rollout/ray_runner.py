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
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rollyard.agents.blackbox import BlackBoxRunner
from rollyard.agents.blackbox.relay import NodeRelay
from rollyard.agents.loop import AgentConfig
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
        return res.model_dump(mode="json")

    async def aclose(self) -> None:
        """Close this node's relays (their sockets and directory)."""
        await self.relay.aclose()

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class RayRunner:
    """``ProgramRunner`` over a set of ``RolloutWorker`` actors, round-robin."""

    remote = True

    def __init__(self, cfg: Config, run_dir: Path) -> None:
        import ray

        if cfg.ray.address != "local" and is_loopback(cfg.gateway.host) and not cfg.gateway.advertise:
            log.warning(
                "gateway.host %s is loopback: Ray workers on other nodes cannot reach it "
                "(bind gateway.host: 0.0.0.0 and set gateway.advertise to this node's address)",
                cfg.gateway.host,
            )
        self._owns = False
        self._tmp: Path | None = None
        address = cfg.ray.address
        if not ray.is_initialized():
            if address == "local":
                # Ray's socket paths must stay under 107 bytes, so its session lives in a short
                # temp dir (removed at close); the run dir records where.
                self._tmp = Path(tempfile.mkdtemp(prefix="ryray-", dir="/tmp"))
                (run_dir / "logs").mkdir(parents=True, exist_ok=True)
                (run_dir / "logs" / "ray_temp_dir.txt").write_text(f"{self._tmp}\n")
                ray.init(
                    num_cpus=max(2, cfg.ray.workers),
                    _temp_dir=str(self._tmp),
                    include_dashboard=False,
                    log_to_driver=False,
                )
            else:
                ray.init(address=address, log_to_driver=False)
            self._owns = True
        actor = ray.remote(num_cpus=cfg.ray.num_cpus_per_worker)(RolloutWorker)
        self.workers = [actor.remote(cfg.sandbox.provider) for _ in range(cfg.ray.workers)]
        self._next = itertools.cycle(self.workers)
        self.timeout_s = cfg.agent.timeout_s
        log.info("ray rollout workers=%d address=%s", len(self.workers), address)

    async def run(
        self, task: Task, program: Program, base_url: str, agent: AgentConfig | BlackBoxRunner
    ) -> EpisodeResult:
        worker = next(self._next)
        sent = agent if isinstance(agent, BlackBoxRunner) else agent.model_dump(mode="json")
        out = await worker.run.remote(str(task.root), program.api_key, base_url, sent, self.timeout_s)
        return EpisodeResult.model_validate(out)

    def nodes(self) -> list[str]:
        import ray

        return list(ray.get([w.node.remote() for w in self.workers]))

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # a dead worker has nothing left to close
            ray.get([w.aclose.remote() for w in self.workers], timeout=10)
        for w in self.workers:
            ray.kill(w)
        if self._owns:
            ray.shutdown()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
