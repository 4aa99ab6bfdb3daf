"""Engines as Ray actors: each starts the launcher's vLLM server on the node Ray placed it on.

``engine.placement: ray`` (or ``auto`` with ``ray.address`` set) makes every engine an
``EngineActor`` asking Ray for ``engine.cpus_per_engine`` CPUs and ``engine.gpus_per_engine``
GPUs; Ray sets the actor's ``CUDA_VISIBLE_DEVICES``, which the vLLM process inherits. The actor
binds the server to its node's address (never loopback) and reports the URL; ``RayEngine`` is
the driver's handle with ``VLLMServer``'s face, so ``EngineFleet`` checks and restarts it as it
does a local process. A restart keeps the first start's port; if Ray can only place the engine
on another node, its URL would change under the gateway, so the restart fails with a clear
error and the run resumes from its checkpoint (``rollyard train --resume``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from rollyard.core.engine_key import KEY_ENV, engine_key
from rollyard.core.errors import EngineStartError, RollyardError
from rollyard.engines.launcher import VLLMServer

log = logging.getLogger(__name__)

CALL_S = 15.0  # how long a health or stop call on the actor may take before the engine counts as gone


class EngineActor:
    """The actor body: one ``VLLMServer`` on this node, bound to the node's address."""

    def __init__(self, key: str, model_dir: str, server: dict[str, Any]) -> None:
        import ray

        os.environ[KEY_ENV] = key  # the driver's engine key, whatever this node's key file holds
        self.ip = ray.util.get_node_ip_address()
        os.environ.setdefault("VLLM_HOST_IP", self.ip)  # vLLM guesses it from a default route otherwise
        self.server = VLLMServer(model_dir, host=self.ip, **server)

    def start(self, model_dir: str, version: int) -> tuple[str, int]:
        """Start (or restart) the server on ``model_dir``; its URL and its process id."""
        self.server.stop()
        self.server.model_dir = Path(model_dir)
        self.server.weights_version = version
        self.server.start()
        assert self.server.proc is not None
        return self.server.url, self.server.proc.pid

    def alive(self) -> bool:
        return self.server.alive()

    def stop(self, timeout_s: float) -> None:
        self.server.stop(timeout_s=timeout_s)

    def kill(self) -> None:
        self.server.kill(wait=False)


class RayEngine:
    """``VLLMServer``'s face over an ``EngineActor`` (what ``EngineFleet`` starts, checks, restarts)."""

    def __init__(
        self,
        model_dir: Path,
        *,
        name: str,
        num_cpus: float,
        num_gpus: float,
        startup_timeout_s: float,
        weights_version: int = 0,
        **server: Any,
    ) -> None:
        self.model_dir = model_dir
        self.weights_version = weights_version
        self.name = name
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.startup_timeout_s = startup_timeout_s
        self.server = {**server, "startup_timeout_s": startup_timeout_s}
        self.actor: Any = None
        self.first_url: str | None = None
        self.url = ""
        self.pid: int | None = None

    def start(self) -> RayEngine:
        """Place a fresh actor and start its server; waits for a node with room up to
        ``startup_timeout_s`` (a lost node that returns in time gets the engine back)."""
        import ray

        self.stop()
        remote = ray.remote(EngineActor).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_concurrency=4, max_restarts=0
        )
        if self.first_url is not None:  # the gateway knows this port: keep it
            self.server["port"] = int(self.first_url.rsplit(":", 1)[1])
        self.actor = remote.remote(engine_key(), str(self.model_dir), self.server)
        try:
            url, self.pid = ray.get(
                self.actor.start.remote(str(self.model_dir), self.weights_version),
                timeout=self.startup_timeout_s + CALL_S,
            )
        except ray.exceptions.GetTimeoutError:
            self.stop()
            raise EngineStartError(
                f"{self.name}: no Ray node placed and started it within {self.startup_timeout_s:.0f} s "
                f"(it asks for {self.num_cpus} CPU, {self.num_gpus} GPU: see `ray status`)"
            ) from None
        except ray.exceptions.RayError as e:
            self.stop()
            cause = getattr(e, "cause", None)  # a task error's own exception; its str is a traceback
            if isinstance(cause, RollyardError):  # the server's own clear error (a log tail, a limit)
                raise EngineStartError(f"{self.name} on its Ray node: {cause}") from None
            why = type(cause).__name__ if cause is not None else type(e).__name__
            raise EngineStartError(f"{self.name} failed on its Ray node ({why}; see its Ray logs)") from None
        if self.first_url is not None and url != self.first_url:
            self.stop()
            raise EngineStartError(
                f"{self.name} came back at {url}, not {self.first_url} where the gateway sends its "
                "requests: stop the run and resume it (rollyard train --resume RUN_DIR)"
            )
        self.first_url = self.url = url
        log.info("vllm on ray %s url=%s pid=%d model=%s", self.name, url, self.pid, self.model_dir)
        return self

    def alive(self) -> bool:
        """The actor answers and its server process runs (False when its node is gone)."""
        import ray

        if self.actor is None:
            return False
        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=CALL_S))
        except (ray.exceptions.RayError, TimeoutError):
            return False

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the server (its whole process group), then the actor; a dead actor is just dropped."""
        import ray

        if self.actor is None:
            return
        actor, self.actor = self.actor, None
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            ray.get(actor.stop.remote(timeout_s), timeout=timeout_s + CALL_S)
        with contextlib.suppress(Exception):  # already gone with its node
            ray.kill(actor)
        log.info("vllm on ray %s stopped url=%s", self.name, self.url)

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the server's group on its node; ``wait=False`` (the forced-exit path) only sends it."""
        import ray

        if self.actor is None:
            return
        with contextlib.suppress(Exception):  # its node may be gone
            ref = self.actor.kill.remote()
            if wait:
                ray.get(ref, timeout=CALL_S)
