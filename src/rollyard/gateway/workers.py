"""``rollyard gateway --workers N``: N shard processes under one supervisor.

Each shard is a whole gateway (``serve`` with its ``ShardLayout``, see ``gateway/shards.py``)
in a process of its own, so N shards use N cores. The supervisor only starts, watches and
stops them: a shard that dies is started again (its journal holds its programs and their
conversations, so they carry on; requests in flight at the crash fail and are retried by the
agents), after a pause that doubles per quick death up to ``MAX_BACKOFF_S``. Ctrl-C or SIGTERM
stops every shard; a shard also exits when the supervisor dies (``PR_SET_PDEATHSIG``), so a
``kill -9`` of the supervisor leaves nothing serving.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.gateway.shards import ShardLayout

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # a shard that ran this long before dying is restarted at once
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent (the supervisor) exits."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the supervisor's stop still ends them
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


ShardMain = Callable[[ShardLayout, Any], None]


def _serve_shard(layout: ShardLayout, kwargs: dict[str, Any]) -> None:
    """``rollyard gateway --workers``' shard: ``serve`` with its layout."""
    from rollyard.gateway.serve import serve

    serve(**kwargs, layout=layout)


def _shard_main(target: ShardMain, layout: ShardLayout, arg: Any) -> None:
    """A shard process: serve until SIGTERM (uvicorn stops gracefully on it)."""
    die_with_parent()
    logging.basicConfig(level=logging.WARNING, format=f"shard{layout.index} %(levelname)s %(message)s")
    target(layout, arg)


class Supervisor:
    """Runs ``layout.count`` shards, each ``target(its layout, arg)`` in a process, until stopped
    (``target`` and ``arg`` must pickle: shards are spawned)."""

    def __init__(self, layout: ShardLayout, target: ShardMain, arg: Any) -> None:
        self.layout, self.target, self.arg = layout, target, arg
        self._ctx = multiprocessing.get_context("spawn")  # no inherited loop, threads or sockets
        self.procs: dict[int, BaseProcess] = {}
        self._started: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._due: dict[int, float] = {}
        self.restarts = 0
        self.stopping = False

    def _start(self, k: int) -> None:
        layout = replace(self.layout, index=k)
        proc = self._ctx.Process(target=_shard_main, args=(self.target, layout, self.arg), name=f"shard{k}")
        proc.start()
        self.procs[k], self._started[k] = proc, time.monotonic()
        log.info("gateway shard %d/%d pid=%s port=%d", k, layout.count, proc.pid, layout.port_of(k))

    def start(self) -> None:
        for k in range(self.layout.count):
            self._start(k)

    def watch_once(self) -> None:
        """Restart shards that died (after their back-off); called every ~0.5 s."""
        now = time.monotonic()
        for k, proc in list(self.procs.items()):
            if proc.is_alive() or self.stopping:
                continue
            if k not in self._due:
                ran = now - self._started[k]
                wait = 0.0 if ran > STABLE_S else min(MAX_BACKOFF_S, max(1.0, 2 * self._backoff.get(k, 0.5)))
                self._backoff[k], self._due[k] = wait, now + wait
                log.warning(
                    "gateway shard %d exited (code %s) after %.0f s; restarting in %.0f s",
                    k,
                    proc.exitcode,
                    ran,
                    wait,
                )
            if now >= self._due[k]:
                del self._due[k]
                self.restarts += 1
                self._start(k)

    def stop(self) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    def run(self) -> None:
        """Start, watch until SIGINT/SIGTERM, stop."""
        stop = False

        def _on_signal(signum: int, _frame: object) -> None:
            nonlocal stop
            stop = True

        old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            while not stop:
                self.watch_once()
                time.sleep(0.5)
        finally:
            self.stop()
            for s, handler in old.items():
                signal.signal(s, handler)


def serve_workers(count: int, engines: list[str], **kwargs: Any) -> None:
    """``serve(**kwargs)`` as ``count`` shards (``rollyard gateway --workers``), until interrupted.

    What every shard must agree on is settled here, once: the admin token (one token drives all
    shards) and the policy spec (a bad one fails before any shard starts)."""
    from rollyard.gateway.programs import resolve_admin_token
    from rollyard.sched.registry import policy_from_spec

    policy_from_spec(kwargs.get("policy", "fifo"))
    if not kwargs.get("tcp", True):
        raise ConfigError("--workers needs TCP: a program is created on one shard and reached on its port")
    token, token_file = resolve_admin_token(kwargs.pop("admin_token", None), kwargs["state_dir"])
    if token_file is not None:
        print(f"rollyard gateway: admin token in {token_file}", flush=True)
    layout = ShardLayout(count, 0, kwargs["port"], kwargs.get("uds"), kwargs["host"])
    for k in range(count):
        sock = layout.uds_of(k)
        print(
            f"rollyard gateway: shard {k} on {layout.url_of(k)}" + (f" and {sock}" if sock else ""),
            flush=True,
        )
    Supervisor(layout, _serve_shard, {**kwargs, "engines": engines, "admin_token": token}).run()
