"""The two-rank gloo group that carries weights from the trainer to one engine worker.

gloo's default device takes its address from this machine's hostname, which often resolves to
loopback: across two machines each end then announced 127.0.0.1 to the other and the group
never connected (seen with the engine on another Ray node). Each end here names its address:
the trainer the one its store listens on, the engine the one it routes to the trainer by.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist


def route_address(host: str) -> str:
    """This machine's address on its route to ``host`` (a UDP connect: no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


def gloo_pair(store: Any, rank: int, timeout: datetime.timedelta, address: str) -> Any:
    """Rank ``rank`` of a two-rank gloo group over ``store``, its transport bound to ``address``."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(dist.PrefixStore("rollyard-weights", store), rank, 2, opts)
