"""Admin calls between gateway shards, so that any shard's admin API serves every program.

A program is created on its owner (``ShardLayout.owner``), and ``GET``/``finish``/``trajectory``
of a program a shard does not hold are asked of the other shards in turn; listings gather all
shards'. Only admin calls travel (a few per program's life); model requests never do. A call
carries the caller's own token and a ``FORWARDED`` header, so it is never passed on twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx

from rollyard.core.errors import (
    AuthError,
    Conflict,
    Forbidden,
    GatewayUnavailable,
    InvalidRequest,
    NotFound,
    RateLimited,
    RollyardError,
)
from rollyard.gateway.shards import ShardLayout

FORWARDED = "x-rollyard-shard-forwarded"  # the shard that passed the call on
TIMEOUT_S = 30.0
_PASSED_ON: dict[int, type[RollyardError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


class ShardPeers:
    """This shard's view of the others: its layout and one HTTP client for all calls to them
    (made on first use: a client costs milliseconds of CPU to build, a call much less)."""

    def __init__(self, layout: ShardLayout) -> None:
        self.layout = layout
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()


async def call(
    peers: ShardPeers,
    shard: int,
    method: str,
    path: str,
    token: str,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> Any:
    """``method path`` on shard ``shard`` as the caller; its JSON answer. Its errors come back as
    the same typed errors; an unreachable shard is a ``GatewayUnavailable`` (503)."""
    layout = peers.layout
    url = layout.url_of(shard) + path
    headers = {"authorization": f"Bearer {token}", FORWARDED: str(layout.index)}
    with unanswered_as_unavailable(f"gateway shard {shard} ({url})"):
        resp = await peers.http.request(method, url, json=body, params=params, headers=headers)
    raise_for(resp, f"gateway shard {shard}")
    return resp.json()


@contextlib.contextmanager
def unanswered_as_unavailable(who: str) -> Iterator[None]:
    """A call to a gateway that failed on the way (refused, reset, timed out) as a
    ``GatewayUnavailable`` (503) naming ``who``."""
    try:
        yield
    except httpx.HTTPError as e:
        raise GatewayUnavailable(f"{who} did not answer: {e!r}") from e


def raise_for(resp: httpx.Response, who: str) -> None:
    """A gateway's error answer as the typed error it was raised as there (5xx: unavailable)."""
    if resp.status_code < 300:
        return
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = resp.text[:200]
    raise _PASSED_ON.get(resp.status_code, GatewayUnavailable)(f"{who}: {message}")


async def on_holder(peers: ShardPeers, method: str, path: str, token: str, body: Any = None) -> Any:
    """The answer of the other shard that holds the program ``path`` names (NotFound: none does)."""
    layout = peers.layout
    for k in range(layout.count):
        if k == layout.index:
            continue
        try:
            return await call(peers, k, method, path, token, body)
        except NotFound:
            continue
    raise NotFound(f"no program at {path.split('/')[2]!r} on any of the {layout.count} gateway shards")


async def others_lists(peers: ShardPeers, token: str, params: dict[str, str]) -> list[dict[str, Any]]:
    """Every other shard's ``GET /programs`` rows."""
    rows: list[dict[str, Any]] = []
    for k in range(peers.layout.count):
        if k != peers.layout.index:
            rows += (await call(peers, k, "GET", "/programs", token, params=params))["data"]
    return rows


def passed_on(layout: ShardLayout, headers: Any) -> bool:
    """Whether a call should be passed on to other shards: sharded, and not passed on already."""
    return layout.sharded and FORWARDED not in headers
