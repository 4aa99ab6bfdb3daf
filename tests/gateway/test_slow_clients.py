"""Slow clients and huge headers against the gateway as `rollyard gateway` serves it (uvicorn with
the connection guard, real sockets): partial headers and bodies are cut off, oversized headers get
a 431, and one address cannot hold more than its share of connections (issue 45, class 6)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import uvloop

from rollyard.core.net import free_port
from rollyard.gateway import FastTokenizer, build_gateway, conn_guard, create_app
from rollyard.gateway.serve import uvicorn_config
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend, running

LIMITS = GatewayLimits(
    header_timeout_s=0.5, body_timeout_s=0.5, max_header_bytes=16 * 1024, max_conns_per_peer=6
)


@pytest.fixture
def gateway(tok: FastTokenizer, tmp_path: Path) -> Iterator[tuple[str, int]]:
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    port = free_port()
    with running(uvicorn_config(create_app(gw, limits=LIMITS), LIMITS, port=port, log_level="critical")):
        yield "127.0.0.1", port


def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing, or None if it still held the connection after ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def test_partial_headers_are_cut_off(gateway: tuple[str, int]) -> None:
    with socket.create_connection(gateway) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        start = time.monotonic()
        assert closed_within(s, 5) is not None
        assert time.monotonic() - start < 3
    with socket.create_connection(gateway) as s:  # a slowloris: a byte now and then
        start = time.monotonic()
        for ch in b"GET /health HTTP/1.1\r\n":
            try:
                s.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.1)
        assert closed_within(s, 5) is not None
        assert time.monotonic() - start < 4


def test_a_partial_body_is_cut_off(gateway: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollyard.gateway.errors")
    with socket.create_connection(gateway) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"messages"'
        )
        start = time.monotonic()
        assert closed_within(s, 5) is not None
        assert time.monotonic() - start < 3
    # The handler reading that body saw the client leave: logged as that, not as a 500.
    deadline = time.monotonic() + 3
    while not any("client left" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("client left" in r.getMessage() for r in caplog.records)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_oversized_headers_get_431(gateway: tuple[str, int]) -> None:
    with socket.create_connection(gateway) as s:
        head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (1024 * 1024) + b"\r\n\r\n"
        with contextlib.suppress(OSError):
            s.sendall(head)
        got = closed_within(s, 5)
    assert got is not None and got.startswith(b"HTTP/1.1 431"), (got or b"")[:200]
    host, port = gateway
    assert httpx.get(f"http://{host}:{port}/health", headers={"x-ok": "a" * 1000}).status_code == 200


def test_one_peer_cannot_hold_more_than_its_connections(gateway: tuple[str, int]) -> None:
    host, port = gateway
    held = [socket.create_connection(gateway) for _ in range(LIMITS.max_conns_per_peer)]
    try:
        time.sleep(0.1)
        with socket.create_connection(gateway) as extra:
            assert closed_within(extra, 2) is not None  # closed at once, not held
        held.pop().close()
        time.sleep(0.1)
        assert httpx.get(f"http://{host}:{port}/health").status_code == 200
    finally:
        for s in held:
            s.close()
    # idle connections that never sent a byte are closed after the header timeout too
    s = socket.create_connection(gateway)
    assert closed_within(s, 5) is not None
    s.close()


def test_a_late_loop_does_not_cut_off_a_request_that_arrived_in_time(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    """The whole request arrives within the header timeout, but the gateway's loop is stalled in
    its I/O phase for longer than the timeout (a heavy batch of callbacks; libuv runs due timers
    after that phase, before it polls again): the due deadline must not close the connection
    whose bytes are waiting to be read."""
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    port = free_port()
    config = uvicorn_config(create_app(gw, limits=LIMITS), LIMITS, port=port, log_level="critical")
    server = uvicorn.Server(config)
    loop = uvloop.new_event_loop()
    stall_r, stall_w = os.pipe()

    def stall() -> None:  # an I/O callback that holds the loop for as long as it is told
        time.sleep(int.from_bytes(os.read(stall_r, 1), "big") / 10)

    loop.add_reader(stall_r, stall)
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port)) as s:
            time.sleep(0.1)  # accepted: the 0.5 s header deadline runs
            os.write(stall_w, bytes([15]))  # the loop stalls 1.5 s, past the deadline
            time.sleep(0.1)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")  # in time
            got = closed_within(s, 5)
        assert got is not None and got.startswith(b"HTTP/1.1 200"), got
        # A client that really is too slow is still cut off after a stall.
        with socket.create_connection(("127.0.0.1", port)) as s:
            time.sleep(0.1)
            os.write(stall_w, bytes([10]))
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # never ends its headers
            start = time.monotonic()
            assert closed_within(s, 5) == b""
            assert time.monotonic() - start < 3
    finally:
        server.should_exit = True
        thread.join(10)
        os.close(stall_r)
        os.close(stall_w)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_memory_goes_back_after_a_surge_of_connections(tok: FastTokenizer, tmp_path: Path) -> None:
    """2,000 idle partial connections from several addresses, then all closed: the guard's census
    trims the C heap once the closes settle, and this process's RSS falls back below what it
    held (without the trim it stays at its high-water mark)."""
    limits = GatewayLimits(header_timeout_s=60, body_timeout_s=60)
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    port = free_port()
    config = uvicorn_config(create_app(gw, limits=limits), limits, port=port, log_level="critical")
    with running(config):
        census = config.http.census  # the class uvicorn_config made for this server
        socks = []
        for i in range(2000):
            s = socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.0.{2 + i // 500}", 0))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            socks.append(s)
        deadline = time.monotonic() + 20
        while census.open < 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert census.open >= 2000, census.open
        held = _rss_mb()
        for s in socks:
            s.close()
        deadline = time.monotonic() + 20
        while census.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the trim runs in a worker thread
        assert census.trims == 1 and census.open <= 5, (census.trims, census.open)
        assert _rss_mb() < held - 2, (held, _rss_mb())


def test_an_idle_gateway_gives_its_heap_back(
    tok: FastTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once no connection has been open for ``IDLE_TRIM_S`` the census trims the C heap once; a
    connection held open, or opened before the time is up, puts it off."""
    monkeypatch.setattr(conn_guard, "IDLE_TRIM_S", 0.5)
    limits = GatewayLimits(header_timeout_s=60, body_timeout_s=60)
    gw = build_gateway({"fake": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny")
    port = free_port()
    config = uvicorn_config(create_app(gw, limits=limits), limits, port=port, log_level="critical")
    with running(config):
        census = config.http.census
        held = socket.create_connection(("127.0.0.1", port))
        brief = socket.create_connection(("127.0.0.1", port))
        brief.close()
        time.sleep(1.5)  # one still open: no idle trim
        assert census.idle_trims == 0, census.idle_trims
        held.close()
        time.sleep(0.2)
        again = socket.create_connection(("127.0.0.1", port))  # back before the time is up
        time.sleep(1.0)
        assert census.idle_trims == 0, census.idle_trims
        again.close()
        deadline = time.monotonic() + 10
        while census.idle_trims == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        assert census.idle_trims == 1 and census.open == 0, (census.idle_trims, census.open)
