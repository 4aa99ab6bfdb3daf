"""``rollyard bench soak``'s load, shrunk, against the real app (scripted engine): keep-alive
clients, multi-turn streaming and not, programs finished and replaced, 10 MB bodies refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rollyard.bench._procs import ADMIN
from rollyard.bench.soak import _run
from rollyard.core.net import free_port
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.serve import uvicorn_config
from rollyard.gateway.settings import GatewayLimits

from .conftest import ScriptedBackend, running, serving


def test_a_short_soak_has_no_errors_no_resets_and_frees_finished_programs(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    with serving(create_app(gw, poll_interval_s=0.2)) as url:
        res = asyncio.run(_run(url, os.getpid(), seconds=6.0, programs=40, concurrency=16))
    assert res["requests"] > 50, res
    assert res["errors"] == 0 and res["resets"] == 0, res
    assert res["big_bodies_sent"] >= 2 and res["big_bodies_refused"] == res["big_bodies_sent"], res
    assert res["programs_finished"] >= 16
    # The gateway's loop lag over the run, from its /metrics (a probe wakes every 0.1 s).
    assert res["loop_lag_samples"] >= 30 and 0 < res["loop_lag_p50_ms"] <= res["loop_lag_p99_ms"], res
    # The measured thread's scheduling (here the test's own main thread: it ran the clients).
    assert 0 < res["loop_thread_cpu_share"] <= 1.05 and res["loop_thread_runq_wait_share"] >= 0, res
    assert res["loop_thread_runq_wait_ms_mean"] >= 0, res
    # Every finished program's in-memory state is gone; only those still mid-conversation (at
    # most one per client) and those the soak abandoned unfinished (freed by the idle TTL) remain.
    assert len(gw.conversations) <= 16 + res["programs_abandoned"], res


def test_the_slow_client_phase_holds_partial_connections_beside_the_load(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    """Hundreds of idle partial connections from other loopback addresses, cut off by the
    connection guard's header/body timeouts and reopened, while the load and new connections
    go on (the full bench holds thousands)."""
    limits = GatewayLimits(header_timeout_s=1.0, body_timeout_s=1.0)
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    port = free_port()
    config = uvicorn_config(create_app(gw, poll_interval_s=0.2, limits=limits), limits, port=port)
    with running(config):
        url = f"http://127.0.0.1:{port}"
        res = asyncio.run(_run(url, os.getpid(), seconds=18.0, programs=40, concurrency=16, slow_conns=300))
    assert res["errors"] == 0 and res["resets"] == 0, res
    assert res["slow_conns_target"] == 300 and res["slow_conns_held"] >= 200, res
    assert res["slow_closed_by_gateway"] >= 300, res  # the guard cut each one off at least once
    # A probe every 50 ms over the prober's 5 s window, none waiting for the one before (a
    # serial prober got 2-4 probes in on a loaded CI host, each answer taking ~1 s); every one
    # must be answered.
    assert res["new_conn_probes"] >= 20 and res["new_conn_failures"] == 0, res
    assert res["slow_health_samples"] >= 5 and res["slow_health_p99_ms"] > 0, res
    assert res["loop_cpu_share_during_slow"] > 0 and res["loop_cpu_share_before_slow"] > 0, res
    # The gateway's own loop lag inside the phase and before it, from its histogram's scrapes.
    assert res["slow_loop_lag_p99_ms"] > 0 and res["loop_lag_p99_ms_before_slow"] > 0, res
    assert 0 < res["slow_holder_cpu_share"] < 2, res
    # Memory while the phase held its connections and at the end, after they closed (here the
    # gateway is this process, whose descriptors also hold the load's client sockets: the
    # full bench's separate gateway shows them, 3,535 held -> 533 at the end).
    assert res["gateway_fds_slow_held"] > 0 and res["gateway_fds_end"] > 0, res
    assert res["rss_mb_slow_held"] >= res["anon_rss_mb_slow_held"] > 0, res
    assert res["rss_mb_end"] >= res["anon_rss_mb_end"] > 0, res
