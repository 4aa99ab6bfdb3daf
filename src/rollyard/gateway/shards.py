"""Gateway shards: N processes, each owning a share of the programs and of every engine.

Why shards own programs (and not a front that routes every request): a program's turns build
on its conversation state, its lock and its journal rows, so the process that holds them must
see all of its requests. A front proxy would parse and relay every model request a second
time, about doubling the gateway's CPU per request (the thing shards exist to spread). Here a
program lives on one shard from its creation, and its creation answer gives the agent that
shard's address (``base_urls``); no request is relayed after that.

Which shard: a group's programs stay together (group-aware policies such as Seer's see whole
groups), so a program with ``group_size > 1`` goes to the shard its ``group_id`` hashes to;
a lone program goes by its own id (random unless the caller names it), which spreads the
ubiquitous ``group_id: default`` evenly. Any shard accepts a creation and forwards it to the
owner once (the one extra hop a program ever pays).

Each engine is split evenly: a shard schedules against ``1/N`` of each engine's request slots
(``capacity``) and of its KV tokens, so the shards' budgets never sum past the engine's, and
no program waits on another shard's queue. The cost of a static split: one shard's idle share
is not lent to a busy one; with hashing, shards see near-equal load once there are more
programs than shards.

Shard ``k`` of ``N`` listens on ``port + k`` and, with a unix socket, on ``NAME-k.sock``;
its journal is ``journal-k.db`` in the state directory (``journal.db`` when ``N == 1``), and
``rollyard export`` reads them all.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from rollyard.core.errors import ConfigError

JOURNAL = "journal.db"


def shard_of(key: str, count: int) -> int:
    """A stable shard index for ``key`` (the same in every process and run, unlike ``hash``)."""
    if count <= 1:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def owner_key(program_id: str, group_id: str, group_size: int) -> str:
    """What decides a program's shard: its group when it has one, else itself."""
    return f"group:{group_id}" if group_size > 1 else f"program:{program_id}"


@dataclass(frozen=True)
class ShardLayout:
    """Where each of ``count`` shards listens and journals; ``index`` is this process's."""

    count: int = 1
    index: int = 0
    port: int = 8800  # shard k listens on port + k
    uds: Path | None = None
    host: str = "127.0.0.1"  # where the shards reach each other (all listen on the same host)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"--workers must be >= 1, not {self.count}")
        if not 0 <= self.index < self.count:
            raise ConfigError(f"shard {self.index} is not one of {self.count} shards")
        if self.port and self.port + self.count - 1 > 65535:
            raise ConfigError(f"ports {self.port}..{self.port + self.count - 1} do not all exist")

    @property
    def sharded(self) -> bool:
        return self.count > 1

    @property
    def share(self) -> float:
        """This shard's fraction of every engine's slots and KV tokens."""
        return 1.0 / self.count

    def port_of(self, k: int) -> int:
        return self.port + k

    def url_of(self, k: int) -> str:
        """How shard ``k`` is reached from this host (a wildcard bind is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port_of(k)}"

    def uds_of(self, k: int) -> Path | None:
        if self.uds is None or not self.sharded:
            return self.uds
        return self.uds.with_name(f"{self.uds.stem}-{k}{self.uds.suffix}")

    def journal_of(self, state_dir: Path, k: int) -> Path:
        return state_dir / (JOURNAL if not self.sharded else f"journal-{k}.db")

    def owner(self, program_id: str, group_id: str, group_size: int) -> int:
        return shard_of(owner_key(program_id, group_id, group_size), self.count)


def shared_capacity(capacity: int, share: float) -> int:
    """A shard's request slots on one engine: its share, rounded down (the shards' sum stays
    within the engine's), but at least one."""
    return max(1, math.floor(capacity * share + 1e-9))


def journals_in(path: Path) -> list[Path]:
    """The journal files a path names: the file itself, or every shard's in a state directory."""
    if path.is_file():
        return [path]
    if path.is_dir():
        shards = [p for p in path.glob("journal-*.db") if p.stem.split("-", 1)[1].isdigit()]
        found = sorted(shards, key=lambda p: int(p.stem.split("-", 1)[1]))
        single = path / JOURNAL
        return found or ([single] if single.is_file() else [])
    return []
