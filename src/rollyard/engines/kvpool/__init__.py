"""A KV pool the engines share (``engine.kv_pool``): config, block store, and our vLLM connector.

``connector`` imports vLLM and is loaded only inside an engine; the rest is plain Python.
"""

from rollyard.engines.kvpool.config import KVPoolConfig
from rollyard.engines.kvpool.store import BlockStore, block_keys

__all__ = ["BlockStore", "KVPoolConfig", "block_keys"]
