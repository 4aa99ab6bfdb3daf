"""A unix socket on a Ray worker's node that relays to the run's gateway over TCP.

A black-box agent's sandbox has no network of its own: its only way out is a unix socket bound
into it (the forwarder inside turns the agent's HTTP on 127.0.0.1 into connections on that
socket). On the run's own machine that socket is the gateway's. On another node, this relay is:
it listens on a socket in a fresh directory and passes each connection, byte for byte, to the
gateway's advertised TCP address (the program's shard). Nothing is parsed or rewritten; every
request still carries, and is checked by, its program's own key, and the admin token never
passes here (the agent does not have it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from rollyard.agents.blackbox.forwarder import splice


class NodeRelay:
    """Relays, one per gateway address, each on its own socket; closed together."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._servers: dict[tuple[str, int], tuple[asyncio.AbstractServer, Path]] = {}

    async def socket_for(self, base_url: str) -> Path:
        """The socket that reaches the gateway at ``base_url`` (``http://host:port[/v1]``)."""
        url = urlsplit(base_url)
        if url.hostname is None or url.port is None:
            raise ValueError(f"not a gateway address: {base_url!r}")
        key = (url.hostname, url.port)
        if key not in self._servers:
            if self._dir is None:
                # short (socket paths < 108 bytes) and traversable by the sandbox's leased uid
                self._dir = Path(tempfile.mkdtemp(prefix="ry-relay-", dir="/tmp"))
                os.chmod(self._dir, 0o755)
            path = self._dir / f"gw-{len(self._servers)}.sock"
            host, port = key
            server = await asyncio.start_unix_server(
                lambda r, w: splice(r, w, lambda: asyncio.open_connection(host, port)), str(path)
            )
            os.chmod(path, 0o777)  # the sandbox's uid connects; the program key is the check
            self._servers[key] = (server, path)
        return self._servers[key][1]

    async def aclose(self) -> None:
        for server, _ in self._servers.values():
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
