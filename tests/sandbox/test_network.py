"""Networked sandboxes (``network: true``): outbound access through slirp4netns, never the host's
loopback (where the gateway's TCP port and the engines' HTTP ports listen)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator

import pytest

from rollyard.core.errors import SandboxError
from rollyard.core.net import this_host_address
from rollyard.sandbox import SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider

pytestmark = pytest.mark.skipif(
    shutil.which("slirp4netns") is None or os.geteuid() != 0, reason="needs slirp4netns and root"
)


def _probe(host: str, port: int) -> str:
    return f"exec 3<>/dev/tcp/{host}/{port} && echo connected"


async def _listener(host: str) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(lambda r, w: w.close(), host, 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, int]]:
    """A TCP listener on the host's 127.0.0.1 and one on its primary (non-loopback) address."""
    outside = this_host_address()
    if outside.startswith("127."):
        pytest.skip("the host has no non-loopback IPv4 address")
    lo, lo_port = await _listener("127.0.0.1")
    pub, pub_port = await _listener(outside)
    yield {"127.0.0.1": lo_port, outside: pub_port}
    for s in (lo, pub):
        s.close()


async def test_a_networked_sandbox_reaches_out_but_not_the_hosts_loopback(
    provider: BwrapProvider, servers: dict[str, int]
) -> None:
    (lo_port, pub_port), outside = servers.values(), this_host_address()
    sb = await provider.create(SandboxSpec(network=True))
    try:
        # The host's loopback, directly and through slirp's gateway address: refused.
        for host in ("127.0.0.1", "10.0.2.2"):
            r = await sb.exec(_probe(host, lo_port), timeout=10)
            assert r.rc != 0 and "connected" not in r.stdout, (host, r)
        # The same host on an address other machines use: reached, twice (a namespace per sandbox).
        for _ in range(2):
            r = await sb.exec(_probe(outside, pub_port), timeout=10)
            assert r.stdout.strip() == "connected", r
        r = await sb.exec("cat /etc/resolv.conf; ip -o -4 addr show tap0 || cat /proc/net/route")
        assert "nameserver 10.0.2.3" in r.stdout
    finally:
        await sb.close()
    assert sb.leaked == 0 and sb._net is not None and sb._net.netns_fd == -1
    off = await provider.create(SandboxSpec())
    try:  # without network nothing is reachable at all
        assert (await off.exec(_probe(outside, pub_port), timeout=10)).rc != 0
    finally:
        await off.close()


async def test_without_slirp4netns_a_networked_sandbox_is_refused(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.which
    monkeypatch.setattr(
        "rollyard.sandbox._net.shutil.which", lambda name: None if name == "slirp4netns" else real(name)
    )
    with pytest.raises(SandboxError, match="slirp4netns"):
        await provider.create(SandboxSpec(network=True))
