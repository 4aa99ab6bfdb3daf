"""The FastAPI application: wires engines, renderer, scheduler, program table and journal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from fastapi import FastAPI

from rollyard.core.clock import Clock, SystemClock
from rollyard.engines.base import Backend
from rollyard.gateway import (
    errors,
    routes_admin,
    routes_anthropic,
    routes_engines,
    routes_meta,
    routes_openai_chat,
    routes_openai_responses,
)
from rollyard.gateway.breaker import CircuitBreaker, ErrorBudget
from rollyard.gateway.divided import Divided
from rollyard.gateway.edge import PREFIXES
from rollyard.gateway.fence_leases import FenceLeases
from rollyard.gateway.guard import GuardedBackend, GuardMetrics
from rollyard.gateway.hot_path import GatewayApp
from rollyard.gateway.idle import IdlePrograms, reap_forever
from rollyard.gateway.limits import BodyLimit
from rollyard.gateway.metrics import GatewayMetrics, watch_loop_lag
from rollyard.gateway.pd import PrefillStage
from rollyard.gateway.pool import EnginePool
from rollyard.gateway.programs import ProgramTable
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import Renderer
from rollyard.gateway.service import Gateway
from rollyard.gateway.settings import GatewayLimits
from rollyard.gateway.shard_calls import ShardPeers
from rollyard.gateway.shards import ShardLayout
from rollyard.gateway.tokenizer import Tokenizer
from rollyard.sched import Policy, Scheduler, make_policy


def build_gateway(
    backends: Mapping[str, Backend],
    tokenizer: Tokenizer,
    journal_path: str | Path,
    admin_token: str,
    model_name: str,
    *,
    clock: Clock | None = None,
    policy: Policy | str | None = None,
    strict_model: bool = False,
    capacity: int = 256,
    divide_tokens: int | None = None,
    share: float = 1.0,
    roles: Mapping[str, str] | None = None,
    pd_min_prompt_tokens: int = 512,
) -> Gateway:
    """The gateway's parts; ``divide_tokens`` turns on divided rollout with chunks of that size;
    ``share``: the fraction of every engine this gateway (one of several shards) schedules;
    ``roles``: engine -> ``engine.role``: with prefill engines, first prompts of at least
    ``pd_min_prompt_tokens`` are prefilled there (``gateway.pd``)."""
    clock = clock or SystemClock()
    metrics = GatewayMetrics()
    journal = SqliteJournal(journal_path)
    programs = ProgramTable(journal, clock, admin_token)
    if isinstance(policy, str):
        policy = make_policy(policy)
    pool = EnginePool(backends, Scheduler(clock, policy), metrics, capacity, share, roles)
    divided = Divided(divide_tokens) if divide_tokens else None
    gw = Gateway(
        pool, Renderer(tokenizer), programs, journal, clock, metrics, model_name, strict_model, divided
    )
    if any(r == "prefill" for r in (roles or {}).values()):
        gw.pd = PrefillStage(pool, pd_min_prompt_tokens)
    return gw


def create_app(
    gateway: Gateway,
    poll_interval_s: float = 2.0,
    limits: GatewayLimits | None = None,
    layout: ShardLayout | None = None,
) -> FastAPI:
    """The HTTP face; engine stats are polled every ``poll_interval_s`` while it runs.

    ``limits`` (``GatewayLimits``): bodies over ``max_body_bytes`` get a 413 before they are
    read whole; ``/metrics`` needs the admin token unless ``open_metrics``; each engine sits
    behind a circuit breaker (``guard.GuardedBackend``) and each program has an error budget;
    programs idle longer than ``program_idle_ttl_s`` are terminated (``idle.IdlePrograms``);
    the event loop's lag is measured (``metrics.watch_loop_lag``). ``layout``: this process is
    one of several shards (``gateway/shards.py``); a program created here that another shard owns
    is created there instead.
    """
    limits = limits or GatewayLimits()
    guard = GuardMetrics(gateway.metrics.registry)
    pool = gateway.pool
    for name, backend in list(pool.backends.items()):
        if not isinstance(backend, GuardedBackend):
            breaker = CircuitBreaker(gateway.clock, limits.breaker_base_s, limits.breaker_max_s)
            pool.backends[name] = GuardedBackend(backend, breaker, guard)
    gateway.renderer.offload_chars = limits.offload_chars
    budget = ErrorBudget(gateway.clock, limits.error_budget, limits.error_window_s, limits.error_cooldown_s)
    gateway.programs.on_terminate(lambda p: budget.forget(p.id))
    idle = IdlePrograms(gateway.clock, limits.program_idle_ttl_s)
    gateway.programs.on_create(lambda p: idle.touch(p.id))
    gateway.programs.on_terminate(lambda p: idle.forget(p.id))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.pool.probe()
        tasks = [
            asyncio.create_task(gateway.pool.poll_forever(poll_interval_s)),
            asyncio.create_task(gateway.pool.tick_forever()),
            asyncio.create_task(reap_forever(idle, gateway.programs, gateway.busy, guard.idle_ended.inc)),
            asyncio.create_task(watch_loop_lag(gateway.metrics)),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await leases.aclose()
            await peers.aclose()
            await gateway.pool.aclose()
            gateway.journal.close()

    app = GatewayApp(title="rollyard gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.max_body_bytes = limits.max_body_bytes  # the model endpoints' short way checks it too
    app.state.gateway = gateway
    app.state.limits, app.state.budget, app.state.guard = limits, budget, guard
    app.state.idle = idle
    app.state.fence_leases = leases = FenceLeases()
    app.state.peers = peers = ShardPeers(layout or ShardLayout())
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    errors.install(app)
    # Model routes first: the router tries routes in order, and they take nearly every request.
    for prefix in PREFIXES:
        shown = prefix == "/v1"
        for module in (routes_openai_chat, routes_openai_responses, routes_anthropic):
            app.include_router(module.router, prefix=prefix, include_in_schema=shown)
        app.include_router(routes_meta.model_router, prefix=prefix, include_in_schema=shown)
    app.include_router(routes_meta.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_engines.router)
    return app
