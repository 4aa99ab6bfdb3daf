"""``rollyard bench kvpool``: restores and migrations with the shared KV pool against without.

Two real vLLM engines (the tiny model, a 2,048-token KV cache each, so other traffic evicts a
paused program's KV) run the same workload three times: sharing ``engine.kv_pool: {kind:
mooncake}`` (skipped where the package is missing), sharing ``{kind: local}``, and with no pool.
The headline ratios are the first pool's; ``local_*`` the second's; ``pd_*`` compare
prefill/decode roles with colocated serving (``bench._kvpool_pd``).
Each program is a two-turn conversation: turn 1 (a ~600-token
prompt, 64 generated tokens), then turn 2 = turn 1's prompt + its output + a 40-token tool reply.

- restore (a ThunderAgent-style pause): turn 1 on engine A; filler requests (other programs'
  prompts, more than the cache holds) evict its KV; turn 2 on A again.
- migrate (a Seer chunk moved): turn 1 on A, turn 2 on B.

Per turn 2, the prompt tokens each engine computed vs loaded come from its own ``/metrics``
(``vllm:prompt_tokens_by_source_total``: ``local_compute`` / ``local_cache_hit`` /
``external_kv_transfer``), read before and after the request (requests run one at a time).
``restore_recompute_ratio`` = tokens computed on restore with the pool / without (likewise
``migrate_``); ``logprob_diff`` = the largest |logprob| difference of turn 2's T=0 tokens
between the two runs, which must also produce the same tokens (``same_tokens``).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from rollyard.bench._kvpool_pd import pd_phase
from rollyard.bench._model import bench_model
from rollyard.bench._report import loadavg, report
from rollyard.core.engine_key import engine_headers
from rollyard.core.errors import ConfigError
from rollyard.engines.kvpool import KVPoolConfig
from rollyard.engines.kvpool.mooncake import MooncakeMaster
from rollyard.engines.launcher import VLLMServer
from rollyard.engines.metrics import prompt_token_sources

log = logging.getLogger(__name__)

KV_TOKENS = 2048
MAX_MODEL_LEN = 1024
PROMPT = 600
TURN1_TOKENS = 64
REPLY = 40
TURN2_TOKENS = 16
FILLER = 900  # tokens per filler prompt; three overfill the 2,048-token cache
PD_KV_TOKENS = 8192  # the pd phase's engines: every program's context fits the decode engine at once


def _complete(url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 1,
            "return_token_ids": True,
            "ignore_eos": True,
        },
        timeout=600.0,
        headers=engine_headers(),
    )
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return {"token_ids": list(choice["token_ids"]), "logprobs": list(choice["logprobs"]["token_logprobs"])}


def _sources(url: str) -> dict[str, int]:
    return prompt_token_sources(httpx.get(f"{url}/metrics", timeout=60.0, headers=engine_headers()).text)


def _measured(url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """One request with the prompt tokens it computed / hit locally / loaded, from ``/metrics``."""
    before = _sources(url)
    t0 = time.perf_counter()
    out = _complete(url, prompt, max_tokens)
    out["latency_s"] = time.perf_counter() - t0
    after = _sources(url)
    for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        out[src] = after.get(src, 0) - before.get(src, 0)
    return out


def _programs(n: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(PROMPT)] for _ in range(n)]


def _reply(i: int, vocab: int) -> list[int]:
    rng = random.Random(10_000 + i)
    return [rng.randrange(10, vocab) for _ in range(REPLY)]


def _workload(a: str, b: str, n: int, vocab: int) -> dict[str, list[dict[str, Any]]]:
    """Restores (turn 2 on A after fillers evicted it) and migrations (turn 2 on B)."""
    filler_rng = random.Random(99)
    out: dict[str, list[dict[str, Any]]] = {"restore": [], "migrate": []}
    for kind, seed, second in (("restore", 1, a), ("migrate", 2, b)):
        progs = _programs(n, seed, vocab)
        turn1 = [_complete(a, p, TURN1_TOKENS) for p in progs]
        if kind == "restore":  # other programs' traffic evicts the paused ones' KV
            for _ in range(3):
                _complete(a, [filler_rng.randrange(10, vocab) for _ in range(FILLER)], 1)
        for i, (p, t1) in enumerate(zip(progs, turn1, strict=True)):
            prompt = p + t1["token_ids"] + _reply(i, vocab)
            row = _measured(second, prompt, TURN2_TOKENS)
            row["prompt_tokens"] = len(prompt)
            out[kind].append(row)
    return out


def _start_pair(model: Path, tmp: Path, tag: str, pool: KVPoolConfig) -> list[VLLMServer]:
    servers = [
        VLLMServer(
            model,
            kv_tokens=KV_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            served_name="tiny",
            log_path=tmp / f"{tag}{i}.log",
            startup_timeout_s=900.0,
            kv_pool=pool,
        )
        for i in range(2)
    ]
    errors: list[BaseException] = []

    def start(s: VLLMServer) -> None:
        try:
            s.start()
        except BaseException as e:  # reported below, after both threads end
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]
    return servers


def _run(model: Path, tmp: Path, tag: str, pool: KVPoolConfig, n: int, vocab: int) -> dict[str, Any]:
    servers = _start_pair(model, tmp, tag, pool)
    try:
        t0 = time.perf_counter()
        rows = _workload(servers[0].url, servers[1].url, n, vocab)
        rows["wall_s"] = time.perf_counter() - t0  # type: ignore[assignment]
        return rows
    finally:
        for s in servers:
            s.stop()


def _ratio(with_pool: list[dict[str, Any]], without: list[dict[str, Any]]) -> float:
    base = sum(r["local_compute"] for r in without)
    return sum(r["local_compute"] for r in with_pool) / base if base else float("nan")


def _compare(pooled: dict[str, Any], plain: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Recompute ratios, loaded tokens, T=0 agreement and median turn-2 latency, pool vs plain."""
    kinds = ("restore", "migrate")
    pairs = [(p, q) for k in kinds for p, q in zip(pooled[k], plain[k], strict=True)]
    out: dict[str, Any] = {}
    for k in kinds:
        out[f"{prefix}{k}_recompute_ratio"] = _ratio(pooled[k], plain[k])
    out[f"{prefix}logprob_diff"] = max(
        abs(x - y) for p, q in pairs for x, y in zip(p["logprobs"], q["logprobs"], strict=True)
    )
    out[f"{prefix}same_tokens"] = all(p["token_ids"] == q["token_ids"] for p, q in pairs)
    for k in kinds:
        out[f"{prefix}{k}_loaded"] = sum(r["external_kv_transfer"] for r in pooled[k])
        out[f"{prefix}{k}_latency_s"] = statistics.median(r["latency_s"] for r in pooled[k])
    return out


def main(quick: bool = False) -> dict[str, Any]:
    """Mooncake (where its package is installed), then our ``local`` pool, then no pool."""
    n = 2 if quick else 4
    tmp = Path(tempfile.mkdtemp(prefix="rollyard-bench-kvpool-"))
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="rollyard-kvpool-", dir=shm))
    runs: dict[str, Any] = {}
    try:
        model = bench_model("tiny", tmp)
        vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
        try:
            master: MooncakeMaster | None = MooncakeMaster(tmp / "mooncake-master.log").start()
        except ConfigError as e:  # the package is not installed: the local pool only
            log.warning("bench kvpool: no mooncake (%s)", e.message)
            master = None
        if master is not None:
            try:
                pool = KVPoolConfig(kind="mooncake", master=master.address, segment_mb=256)
                runs["mooncake"] = _run(model, tmp, "mooncake", pool, n, vocab)
            finally:
                master.stop()
        runs["local"] = _run(model, tmp, "local", KVPoolConfig(kind="local", root=str(root)), n, vocab)
        runs["plain"] = _run(model, tmp, "plain", KVPoolConfig(), n, vocab)
        pd_root = Path(tempfile.mkdtemp(prefix="rollyard-kvpool-pd-", dir=shm))
        try:
            pd = pd_phase(model, tmp, pd_root, n, vocab, PD_KV_TOKENS, MAX_MODEL_LEN)
        finally:
            shutil.rmtree(pd_root, ignore_errors=True)
        first = "mooncake" if "mooncake" in runs else "local"
        summary = {"pool": first, **_compare(runs[first], runs["plain"])}
        if first != "local":
            summary.update(_compare(runs["local"], runs["plain"], prefix="local_"))
        summary["plain_restore_latency_s"] = statistics.median(
            r["latency_s"] for r in runs["plain"]["restore"]
        )
        summary["plain_migrate_latency_s"] = statistics.median(
            r["latency_s"] for r in runs["plain"]["migrate"]
        )
        summary.update(pd)
        summary["programs"] = n
        details = {
            "runs": runs,
            "local_blocks_stored": sum(1 for _ in root.rglob("*.kv")),
            "loadavg": loadavg(),
        }
        return report("kvpool", summary, details)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
