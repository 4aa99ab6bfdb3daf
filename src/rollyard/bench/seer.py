"""``rollyard bench seer``: a synchronous rollout with a long tail, three ways, on two engines.

Workload (same in every variant of a round): ``groups`` GRPO groups of ``G`` single-turn
programs, each group with its own prompt. The long tail is set, not hoped for: a random tiny
model's lengths would be noise, so every program's ``max_tokens`` is drawn and generated
exactly (``ignore_eos``). A group's longest length is log-normal (clipped to ``[min_len,
max_len]``: tens to ~1k tokens, a few groups much longer than the rest) and its members'
lengths spread ~10x below it, so siblings correlate the way Seer's estimate assumes.

Variants, each through the real gateway (in process) on the same two vLLM engines (one core
each), the gateway sending each engine at most ``capacity`` requests at once:

- ``base``: group-bound, FIFO (``group_bound`` preset): a group's requests run on one engine.
- ``divided``: divided rollout (``chunk`` tokens) with Seer's moving router, FIFO order.
- ``context``: the same plus Seer's context-aware order (the ``seer`` preset).

Per round: rollout wall time, generated tokens/s, and ``tail_share``: the fraction of the wall
time during which only the last 10% of requests were still running. Medians over rounds; the
variants' order rotates per round so load drift does not favour one.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollyard.bench._report import report
from rollyard.core.program import Program, SamplingPolicy
from rollyard.gateway.types import ChatRequest, Message
from rollyard.sched import make_policy

VARIANTS: dict[str, tuple[str, dict[str, str], bool]] = {
    "base": ("group_bound", {}, False),
    "divided": ("seer", {"order": "fifo"}, True),
    "context": ("seer", {}, True),
}


def workload(groups: int, size: int, seed: int, min_len: int, max_len: int) -> list[list[int]]:
    """Per group, its members' output lengths (the first is the group's longest)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        top = int(min(max_len, max(min_len, rng.lognormvariate(math.log(max_len / 4), 0.8))))
        out.append([top] + [max(8, int(top * 10 ** -rng.uniform(0, 1))) for _ in range(size - 1)])
    return out


def tail_share(finishes: list[float], wall: float) -> float:
    """Share of the wall time after 90% of the requests had finished."""
    done = sorted(finishes)
    t90 = done[math.ceil(0.9 * len(done)) - 1]
    return (wall - t90) / wall if wall > 0 else 0.0


async def one_round(
    urls: list[str], model_dir: Path, lengths: list[list[int]], variant: str, chunk: int, capacity: int
) -> dict[str, Any]:
    from rollyard.engines.vllm import VLLMBackend
    from rollyard.gateway import FastTokenizer, build_gateway

    preset, parts, divided = VARIANTS[variant]
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-seer-") as tmp:
        backends = {f"engine{i}": VLLMBackend(u, name=f"engine{i}") for i, u in enumerate(urls)}
        gw = build_gateway(
            backends,
            FastTokenizer(model_dir),
            Path(tmp) / "journal.db",
            "bench-admin",
            "tiny",
            policy=make_policy(preset, **parts),  # type: ignore[arg-type]
            capacity=capacity,
            divide_tokens=chunk if divided else None,
        )
        await gw.pool.probe()
        programs = []
        for g, members in enumerate(lengths):
            for n in members:
                sampling = SamplingPolicy(temperature=1.0, max_tokens=n, ignore_eos=True)
                p = Program(group_id=f"g{g}", group_size=len(members), sampling=sampling)
                programs.append((gw.programs.create(p), g))
        finishes: list[float] = []
        t0 = time.perf_counter()

        async def run(p: Program, g: int) -> int:
            msg = Message(role="user", content=f"Task {g}: write about topic number {g * 37 % 101}.")
            r = await gw.chat(p, ChatRequest([msg]))
            finishes.append(time.perf_counter() - t0)
            return r.completion_tokens

        tokens = sum(await asyncio.gather(*(run(p, g) for p, g in programs)))
        wall = time.perf_counter() - t0
        migrations = chunks = 0
        for p, _ in programs:
            for e in gw.journal.trajectory(p.id).events:
                d = e.data.get("divided")
                if d:
                    migrations += d["migrations"]
                    chunks += d["chunks"]
        await gw.pool.aclose()
        gw.journal.close()
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "tail_share": tail_share(finishes, wall),
        "migrations": migrations,
        "chunks": chunks,
    }


async def _run(model_dir: Path, cfg: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack

    from rollyard.engines.launcher import VLLMServer

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with ExitStack() as stack:
        servers = [
            VLLMServer(
                model_dir,
                kv_tokens=cfg["kv_tokens"],
                max_model_len=2048,
                cpu_threads=str(i),  # one core each: two instances, as in Seer's setting
                startup_timeout_s=900.0,  # shared 2-core machine under load
            )
            for i in range(2)
        ]
        for s in servers:
            stack.callback(s.stop)
        with ThreadPoolExecutor(2) as pool:  # both start at once
            list(pool.map(lambda s: s.start(), servers))
        urls = [s.url for s in servers]
        warm = [[16, 16]]
        await one_round(urls, model_dir, warm, "base", cfg["chunk"], cfg["capacity"])
        names = list(VARIANTS)
        for r in range(cfg["rounds"]):
            lengths = workload(cfg["groups"], cfg["group_size"], r, cfg["min_len"], cfg["max_len"])
            for v in names[r % 3 :] + names[: r % 3]:  # rotate so drift does not favour one
                res = await one_round(urls, model_dir, lengths, v, cfg["chunk"], cfg["capacity"])
                res["load"] = os.getloadavg()[0]
                results[v].append(res)
                print(f"seer round={r} variant={v} " + " ".join(f"{k}={x:.4g}" for k, x in res.items()))
    return results


def main(quick: bool = False) -> dict[str, Any]:
    from rollyard.engines.tiny_model import create_model

    cfg: dict[str, Any] = {
        "groups": 4 if quick else 8,
        "group_size": 4 if quick else 8,
        "rounds": 1 if quick else 3,
        "min_len": 32,
        "max_len": 256 if quick else 768,
        "chunk": 32 if quick else 64,
        "capacity": 4 if quick else 8,
        "kv_tokens": 32768,
    }
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-seer-") as tmp:
        model_dir = create_model(Path(tmp) / "tiny", seed=0)
        res = asyncio.run(_run(model_dir, cfg))
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in res.items()}
    base = med["base"]
    summary = {
        "thr_divided": med["divided"]["tok_s"] / base["tok_s"],
        "thr_context": med["context"]["tok_s"] / base["tok_s"],
        "tail_share_base": base["tail_share"],
        "tail_share_ours": med["context"]["tail_share"],
        "migrations": int(med["context"]["migrations"]),
        "load": os.getloadavg()[0],
    }
    details = {"config": cfg, "medians": med, "rounds": res, "load_before": load_before}
    return report("seer", summary, details)
