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


def free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free now (gateway shards listen on consecutive ports)."""
    for _ in range(200):
        base = free_port()
        if base + n > 65536:
            continue
        ok = True
        for p in range(base + 1, base + n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise OSError(f"no {n} consecutive free ports found")


WILDCARDS = ("0.0.0.0", "::", "")


def interface_addresses() -> dict[str, str]:
    """IPv4 address of each network interface that has one (Linux ioctl; stdlib only)."""
    import fcntl
    import struct

    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )  # SIOCGIFADDR
            except OSError:  # no IPv4 address on it
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def this_host_address() -> str:
    """An address other machines can use for this one: the first non-loopback interface's IPv4
    address (by interface index), else loopback when the host has no other."""
    for addr in interface_addresses().values():
        if not addr.startswith("127."):
            return addr
    return "127.0.0.1"


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def advertised_url(bind_host: str, port: int, advertise: str | None = None) -> str:
    """The URL a process on another machine dials for a server bound to ``bind_host:port``.

    ``advertise`` wins (a host or IP, or a whole URL); a wildcard bind advertises this host's
    first non-loopback address; any other bind address is advertised as it is."""
    if advertise:
        return advertise.rstrip("/") if "://" in advertise else f"http://{_host_in_url(advertise)}:{port}"
    host = this_host_address() if bind_host in WILDCARDS else bind_host
    return f"http://{_host_in_url(host)}:{port}"


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
