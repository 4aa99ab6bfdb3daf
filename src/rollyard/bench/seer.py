"""``rollyard bench seer``: a synchronous rollout with a long tail, three ways, on two engines.

Workload (issue 13; the same in every variant of a round): ``groups`` GRPO groups of ``G``
single-turn programs, each group with its own prompt. Output lengths are drawn: a group's
longest is log-normal (clipped to ``[min_len, max_len]``: tens to ~1k tokens, a few groups
far longer than the rest), its members spread ~10x below it, so siblings correlate the way
Seer's estimate assumes; members are shuffled, so no submission order is length-sorted.

The lengths do not reach the scheduler. Every request asks for the same ``max_tokens``
(``max_len``: the cap an RL run sets for all samples), and the generation ends at its drawn
length on the engine side, as if the model emitted EOS there: the bench wraps each engine in
``StopAtLength``, which reads the program's drawn length from a context variable the gateway
never sees, asks vLLM for at most what is left of it (``ignore_eos``, so a random tiny model's
own stopping adds no noise), and reports the chunk that reaches it as finished with ``stop``.
With per-request ``max_tokens`` instead, the ``seer`` order's "longest estimate first" would
read the answer (an oracle), and its probe and online estimate would have nothing to learn.

Variants, each through the real gateway (in process) on the same two vLLM engines (one core
each), the gateway sending each engine at most ``capacity`` requests at once:

- ``base``: group-bound, FIFO (``group_bound`` preset): a group's requests run on one engine.
- ``divided``: divided rollout (``chunk`` tokens) with Seer's moving router, FIFO order.
- ``context``: the same plus Seer's context-aware order (the ``seer`` preset).

Per round: rollout wall time, generated tokens/s, ``tail_share`` (the fraction of the wall time
during which only the last 10% of requests were still running), migrations, and where the time
went: per engine, how long it ran nothing while the rollout was not over (``idle_s``), its mean
running requests, the tokens it prefilled (``prefill_tokens``, from vLLM: re-prefill of moved
chunks shows here) and when the 10% longest requests started (``long_start_s``). Medians over
rounds; the variants' order rotates per round so load drift does not favour one.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollyard.bench._report import report
from rollyard.core.program import Program, SamplingPolicy
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Backend, Completion, WrappedBackend
from rollyard.gateway.types import ChatRequest, Message
from rollyard.sched import make_policy

VARIANTS: dict[str, tuple[str, dict[str, str], bool]] = {
    "base": ("group_bound", {}, False),
    "divided": ("seer", {"order": "fifo"}, True),
    "context": ("seer", {}, True),
}


def workload(groups: int, size: int, seed: int, min_len: int, max_len: int) -> list[list[int]]:
    """Per group, its members' output lengths, shuffled (the longest is at a random place)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        top = int(min(max_len, max(min_len, rng.lognormvariate(math.log(max_len / 4), 0.8))))
        members = [top] + [max(min_len, int(top * 10 ** -rng.uniform(0, 1))) for _ in range(size - 1)]
        rng.shuffle(members)
        out.append(members)
    return out


def tail_share(finishes: list[float], wall: float) -> float:
    """Share of the wall time after 90% of the requests had finished."""
    done = sorted(finishes)
    t90 = done[math.ceil(0.9 * len(done)) - 1]
    return (wall - t90) / wall if wall > 0 else 0.0


@dataclass
class Draw:
    """One program's drawn output length, and its engine calls as ``StopAtLength`` saw them."""

    length: int
    left: int = 0
    calls: list[tuple[str, float, float, int]] = field(default_factory=list)  # engine, start, end, tokens

    def __post_init__(self) -> None:
        self.left = self.length


_DRAW: contextvars.ContextVar[Draw | None] = contextvars.ContextVar("rollyard_bench_seer_draw", default=None)


class StopAtLength(WrappedBackend):
    """An engine whose generations end at the calling program's drawn length (bench only).

    The drawn length travels in a context variable set by the bench's client task, so the
    gateway and its scheduler see only the shared ``max_tokens``; each call asks vLLM for
    ``min(max_tokens, left)`` and a call that reaches the length returns ``stop``, as an EOS
    would. Only ``generate`` is wrapped: the bench does not stream."""

    def __init__(self, inner: Backend, t0: list[float]) -> None:
        super().__init__(inner)
        self._t0 = t0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        draw = _DRAW.get()
        if draw is None:
            return await self.inner.generate(prompt_ids, params)
        start = time.perf_counter() - self._t0[0]
        ask = params.model_copy(update={"max_tokens": max(1, min(params.max_tokens, draw.left))})
        out = await self.inner.generate(prompt_ids, ask)
        draw.left -= len(out.token_ids)
        draw.calls.append((self.name, start, time.perf_counter() - self._t0[0], len(out.token_ids)))
        if draw.left <= 0:
            out = out.model_copy(update={"finish_reason": FinishReason.STOP})
        return out


def timeline(draws: list[Draw], engines: list[str], wall: float) -> dict[str, Any]:
    """Where the time went: per engine its idle seconds (running nothing before the rollout
    ended), time-averaged running requests, and 1 s series of running requests and tokens/s
    (together: the engine's throughput at each batch size, as the run met them)."""
    out: dict[str, Any] = {}
    for e in engines:
        edges = sorted(
            [(s, 1) for d in draws for (n, s, _, _) in d.calls if n == e]
            + [(t, -1) for d in draws for (n, _, t, _) in d.calls if n == e]
        )
        running, last, idle, area = 0, 0.0, 0.0, 0.0
        series: list[int] = []
        for t, step in edges:
            t = min(t, wall)
            if running == 0:
                idle += t - last
            area += running * (t - last)
            while len(series) < int(t):
                series.append(running)
            running, last = running + step, t
        idle += wall - last
        while len(series) < math.ceil(wall):
            series.append(running)
        made = [0.0] * len(series)  # tokens generated per 1 s, each call's spread evenly over it
        for d in draws:
            for n, s, t, k in d.calls:
                if n != e or k == 0:
                    continue
                for b in range(int(s), min(len(made), math.ceil(t))):
                    overlap = min(t, b + 1) - max(s, b)
                    made[b] += k * overlap / (t - s) if t > s else 0.0
        out[e] = {
            "idle_s": idle,
            "mean_running": area / wall if wall > 0 else 0.0,
            "running_1s": series,
            "tok_s_1s": [round(x) for x in made],
        }
    return out


async def one_round(
    urls: list[str],
    model_dir: Path,
    lengths: list[list[int]],
    variant: str,
    cfg: dict[str, Any],
    pool_options: dict[str, float] | None = None,
) -> dict[str, Any]:
    from rollyard.engines.vllm import VLLMBackend
    from rollyard.gateway import FastTokenizer, build_gateway

    preset, parts, divided = VARIANTS[variant]
    t0 = [time.perf_counter()]
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-seer-") as tmp:
        raw = {f"engine{i}": VLLMBackend(u, name=f"engine{i}") for i, u in enumerate(urls)}
        backends: dict[str, Any] = {n: StopAtLength(b, t0) for n, b in raw.items()}
        gw = build_gateway(
            backends,
            FastTokenizer(model_dir),
            Path(tmp) / "journal.db",
            "bench-admin",
            "tiny",
            policy=make_policy(preset, **parts, **(pool_options or {})),  # type: ignore[arg-type]
            capacity=cfg["capacity"],
            divide_tokens=cfg["chunk"] if divided else None,
        )
        await gw.pool.probe()
        before = {n: await b.stats() for n, b in raw.items()}
        # one cap for every sample (what an RL run sets); the drawn length stays engine-side
        sampling = SamplingPolicy(temperature=1.0, max_tokens=cfg["max_len"], ignore_eos=True)
        programs = []
        for g, members in enumerate(lengths):
            for n in members:
                p = Program(group_id=f"g{g}", group_size=len(members), sampling=sampling)
                programs.append((gw.programs.create(p), g, Draw(n)))
        finishes: list[float] = []
        t0[0] = time.perf_counter()

        async def run(p: Program, g: int, draw: Draw) -> int:
            _DRAW.set(draw)  # this task's context only: the gateway never reads it
            msg = Message(role="user", content=f"Task {g}: write about topic number {g * 37 % 101}.")
            r = await gw.chat(p, ChatRequest([msg]))
            finishes.append(time.perf_counter() - t0[0])
            return r.completion_tokens

        tokens = sum(await asyncio.gather(*(run(p, g, d) for p, g, d in programs)))
        wall = time.perf_counter() - t0[0]
        after = {n: await b.stats() for n, b in raw.items()}
        migrations = chunks = 0
        for p, _, _ in programs:
            for e in gw.journal.trajectory(p.id).events:
                d = e.data.get("divided")
                if d:
                    migrations += d["migrations"]
                    chunks += d["chunks"]
        await gw.pool.aclose()
        gw.journal.close()
    draws = [d for _, _, d in programs]
    assert all(d.left == 0 for d in draws), "a generation ended before its drawn length"
    longest = sorted(draws, key=lambda d: -d.length)[: max(1, len(draws) // 10)]
    lines = timeline(draws, list(raw), wall)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "tail_share": tail_share(finishes, wall),
        "migrations": migrations,
        "chunks": chunks,
        "prefill_tokens": sum(after[n].prefill_tokens - before[n].prefill_tokens for n in raw),
        "idle_s": sum(v["idle_s"] for v in lines.values()),
        "long_start_s": statistics.mean(d.calls[0][1] for d in longest),
        "timeline": lines,
    }


def _kv_pool(stack: Any, tmp: Path) -> Any:
    """``ROLLYARD_BENCH_SEER_KV_POOL=mooncake|local``: the engines share a KV pool, so a moved
    chunk loads its context instead of re-prefilling it, and the router prices the move as a
    load, as ``rollyard train`` sets it up (``docs/kv-pool.md``)."""
    from rollyard.engines.kvpool import KVPoolConfig
    from rollyard.engines.kvpool.mooncake import MooncakeMaster

    kind = os.environ.get("ROLLYARD_BENCH_SEER_KV_POOL", "none")
    if kind == "mooncake":
        master = MooncakeMaster(tmp / "mooncake-master.log").start()
        stack.callback(master.stop)
        return KVPoolConfig(kind="mooncake", master=master.address, segment_mb=256)
    if kind == "local":
        return KVPoolConfig(kind="local", root=str(tmp / "kv-pool"))
    return KVPoolConfig(kind=kind)


async def _run(model_dir: Path, cfg: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack

    from rollyard.engines.launcher import VLLMServer

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with ExitStack() as stack:
        pool = _kv_pool(stack, model_dir.parent)
        priced: dict[str, float] = {}
        if pool.enabled:
            from rollyard.engines.kvpool.config import kv_bytes_per_token

            priced["pool_load_tok_s"] = pool.load_tok_s(kv_bytes_per_token(model_dir, "float32"))
        servers = [
            VLLMServer(
                model_dir,
                kv_tokens=cfg["kv_tokens"],
                max_model_len=2048,
                cpu_threads=str(i),  # one core each: two instances, as in Seer's setting
                startup_timeout_s=900.0,  # shared 2-core machine under load
                kv_pool=pool,
            )
            for i in range(2)
        ]
        for s in servers:
            stack.callback(s.stop)
        with ThreadPoolExecutor(2) as pool:  # both start at once
            list(pool.map(lambda s: s.start(), servers))
        urls = [s.url for s in servers]
        await one_round(urls, model_dir, [[16, 16]], "base", cfg)  # warm-up
        names = list(VARIANTS)
        for r in range(cfg["rounds"]):
            lengths = workload(cfg["groups"], cfg["group_size"], r, cfg["min_len"], cfg["max_len"])
            for v in names[r % 3 :] + names[: r % 3]:  # rotate so drift does not favour one
                res = await one_round(urls, model_dir, lengths, v, cfg, priced)
                res["load"] = os.getloadavg()[0]
                results[v].append(res)
                shown = {k: x for k, x in res.items() if k != "timeline"}
                print(f"seer round={r} variant={v} " + " ".join(f"{k}={x:.4g}" for k, x in shown.items()))
                for e, line in res["timeline"].items():
                    print(f"  {e} running per 1 s: {line['running_1s']}")
                    print(f"  {e} tokens/s per 1 s: {line['tok_s_1s']}")
    return results


def defaults(quick: bool = False) -> dict[str, Any]:
    """The issue's workload: 16 groups of G=8, lengths tens to ~1k, chunk 256, vLLM's batching."""
    return {
        "groups": 4 if quick else 16,
        "group_size": 4 if quick else 8,
        "rounds": 1 if quick else 3,
        "min_len": 16,
        "max_len": 256 if quick else 1024,  # also every request's max_tokens
        "chunk": 64 if quick else 256,
        "capacity": 8 if quick else 64,
        "kv_tokens": 65536,
    }


def config(quick: bool = False) -> dict[str, Any]:
    """``defaults``, where ``ROLLYARD_BENCH_SEER_<KEY>`` overrides a key (an int)."""
    cfg = defaults(quick)
    for key in cfg:
        value = os.environ.get(f"ROLLYARD_BENCH_SEER_{key.upper()}")
        if value:
            cfg[key] = int(value)
    return cfg


def main(quick: bool = False) -> dict[str, Any]:
    from rollyard.engines.tiny_model import create_model

    cfg = config(quick)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-seer-") as tmp:
        model_dir = create_model(Path(tmp) / "tiny", seed=0)
        res = asyncio.run(_run(model_dir, cfg))
    keys = [k for k in res["base"][0] if k != "timeline"]
    med = {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in res.items()}
    ratio = {
        v: [a["wall_s"] / b["wall_s"] for a, b in zip(res["base"], rs, strict=True)] for v, rs in res.items()
    }
    summary = {
        "thr_divided": statistics.median(ratio["divided"]),
        "thr_context": statistics.median(ratio["context"]),
        "tail_share_base": med["base"]["tail_share"],
        "tail_share_ours": med["context"]["tail_share"],
        "migrations": int(med["context"]["migrations"]),
        "load": os.getloadavg()[0],
    }
    details = {
        "config": cfg,
        "medians": med,
        "per_round_speedup": ratio,
        "rounds": res,
        "load_before": load_before,
    }
    # a run with other settings is a diagnostic: its own result file (seer-capacity16,
    # seer-kvtokens4096, ...), the headline stays
    base = defaults(quick)
    name = "seer" + "".join(f"-{k.replace('_', '')}{v}" for k, v in cfg.items() if v != base[k])
    pool = os.environ.get("ROLLYARD_BENCH_SEER_KV_POOL", "none")
    name += "" if pool == "none" else f"-kvpool{pool}"
    details["kv_pool"] = pool
    return report(name, summary, details)
