"""A KV block store shared by engines on one host: one file per block, named by its prefix hash.

A block's key chains the hash of the block before it with its own token ids (as vLLM's prefix
cache keys blocks), so a key names the whole prefix up to and including that block: two prompts
that share their first k full blocks share k keys, whatever follows. Files are written to a
temporary name and renamed, so a reader sees a whole block or none; a directory on ``/dev/shm``
keeps them in memory. The store is pure Python (no vLLM): the connector and the tests use it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT_HASH = b"rollyard-kv-pool-v1"


def block_keys(
    token_ids: Sequence[int], block_size: int, salt: str = "", start: list[str] | None = None
) -> list[str]:
    """Chained keys of the full blocks of ``token_ids``; ``start`` (keys already made for a prefix
    of the same tokens) is extended, not recomputed."""
    keys = list(start or [])
    parent = bytes.fromhex(keys[-1]) if keys else hashlib.sha256(ROOT_HASH + salt.encode()).digest()
    for b in range(len(keys), len(token_ids) // block_size):
        block = token_ids[b * block_size : (b + 1) * block_size]
        h = hashlib.sha256(parent)
        h.update(b",".join(str(t).encode() for t in block))
        parent = h.digest()
        keys.append(parent.hex())
    return keys


class BlockStore:
    """Files under ``root/namespace``; the namespace names everything that makes KV bytes
    comparable (model, dtype, block shape, weights epoch), so unlike engines never mix."""

    def __init__(self, root: str | Path, namespace: str) -> None:
        self.root = Path(root)
        self.dir = self.root / namespace

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.kv"

    def has(self, key: str) -> bool:
        return self.path(key).exists()

    def hits(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored (a prefix stops at its first missing block)."""
        n = 0
        for k in keys:
            if not self.has(k):
                break
            n += 1
        return n

    def put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{key}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: a reader sees the whole block or nothing

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            return None

    def clear(self) -> None:
        """Drop this namespace (renamed away first, so no reader sees half of it)."""
        if not self.dir.exists():
            return
        trash = self.root / f".trash-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(self.dir, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)
