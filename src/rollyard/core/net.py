"""Host networking helpers every layer needs (engines, gateway, black-box agents, tests)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on the host now (inside a network namespace every port is free).

    Another process may take it before the caller binds; callers that can retry do.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
