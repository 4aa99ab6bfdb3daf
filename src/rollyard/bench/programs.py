"""``rollyard bench programs``: KV-oversubscribed multi-turn agents, straight to vLLM and
through the gateway under ``fifo``, ``thunder`` and ``rollyard``.

Each program is an agent loop over the official OpenAI SDK: a model call, a "tool" that
sleeps 0.5-2 s, its output appended, again, for ``TURNS`` turns; half the programs start
with a long prompt (~470 tokens), half with a short one (~60). The engine serves the
``small`` model (26M parameters, so recomputing evicted context costs real prefill: ~400
prompt tokens/s on the 2-core machine) with a KV cache (``KV_TOKENS``, 2560 by default) far
below what the programs' contexts add up to, so vLLM runs out of blocks, preempts and
evicts cached prefixes when every program is admitted at once. Paths run in alternating
order in each round (outside load lands on all), every prompt carries its round and path
so no path hits another's prefix cache.

Reported (medians over rounds): ``thr_vs_vllm`` = rollyard turns/min over direct,
``thr_vs_thunder`` = rollyard over thunder, vLLM preemptions during the direct and the
rollyard path, ``long_short_ttft`` = the median first-response time of long-prompt programs
over that of short-prompt ones (rollyard; thunder's in the details), ``hold_p99_s`` (the
gateway's hold-time histogram, upper bucket bound) and the prefix-cache ``hit_rate`` under
rollyard. The details also give, per path, the prompt tokens vLLM computed (not served from
its prefix cache) and its seconds in prefill: the recompute that pausing is meant to save.
A request that waits past ``ROLLYARD_BENCH_TIMEOUT_S`` (120 s) ends its program (counted in
``timed_out``; its turns so far count). ``ROLLYARD_BENCH_ENGINES=2`` runs the routing rows: two
engines, each pinned to one core, the direct clients split evenly between them (a long and a
short program each), result ``programs-2engines``. ``ROLLYARD_BENCH_EXTRA`` adds paths, one
``--policy`` spec each, ";"-separated (``fifo,router=cost_aware;seer``).

The defaults (8 programs x 3 turns, 3 rounds, 12 paths) took 9 minutes on a quiet machine and 32
at load average 12-25 on the 2-core machine, plus ~1-3 minutes of engine start;
``ROLLYARD_BENCH_PROGRAMS``, ``_TURNS``, ``_ROUNDS``, ``_KV_TOKENS``, ``_MODEL_SIZE``
(``small`` | ``tiny``) and ``_MAX_MODEL_LEN`` size it up (the issue's 32-48 programs over
6-10 turns take hours here). ``ROLLYARD_BENCH_ENGINE_URL`` + ``ROLLYARD_BENCH_MODEL_DIR``
reuse a running engine (served as ``bench``; then the KV size is its own);
``ROLLYARD_BENCH_OURS`` gives the rollyard path's ``--policy`` (``rollyard,min_run_s=30``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollyard.bench._procs import ADMIN, _gateway
from rollyard.bench._prom import histogram_buckets
from rollyard.bench._report import loadavg, report

SERVED = "bench"
PATHS = ("direct", "fifo", "thunder", "rollyard")
TIMEOUT_S = float(os.environ.get("ROLLYARD_BENCH_TIMEOUT_S", 120))
OURS = os.environ.get("ROLLYARD_BENCH_OURS", "rollyard")  # the rollyard path's --policy (options: NAME,k=v)
MAX_TOKENS = 32
LONG_WORDS, SHORT_WORDS = 400, 50  # ~470 and ~60 tokens of the small model's tokenizer
WORDS = ["module", "class", "import", "return", "value", "config", "parser", "buffer", "engine", "token"]


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(f"ROLLYARD_BENCH_{name}", default))


@contextlib.contextmanager
def _engines(size: str, kv_tokens: int, max_model_len: int, count: int) -> Iterator[tuple[list[str], Path]]:
    """``count`` fresh vLLMs (one core each when there are two) serving a new ``size`` model with
    a capped KV cache, or the engine named by ``ROLLYARD_BENCH_ENGINE_URL`` + ``_MODEL_DIR``."""
    url, model = os.environ.get("ROLLYARD_BENCH_ENGINE_URL"), os.environ.get("ROLLYARD_BENCH_MODEL_DIR")
    if url and model:
        yield [url], Path(model)
        return
    from rollyard.engines.launcher import VLLMServer
    from rollyard.engines.tiny_model import create_model
    from rollyard.rollout.services import LOGPROBS_OF_SAMPLED

    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        model_dir = create_model(Path(d) / size, seed=0, size=size)
        urls = []
        for i in range(count):
            server = VLLMServer(
                model_dir,
                kv_tokens=kv_tokens,
                max_model_len=max_model_len,
                served_name=SERVED,
                startup_timeout_s=900.0,  # the small model on 2 loaded cores: 2-5 minutes
                cpu_threads=str(i % cpus) if count > 1 else None,
                extra_args=list(LOGPROBS_OF_SAMPLED),  # what an attached engine must record
            )
            urls.append(stack.enter_context(server).url)
        yield urls, model_dir


def _seed(tag: str, i: int) -> int:
    return zlib.crc32(f"{tag} {i}".encode())


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _program(base: str, key: str, tag: str, long: bool, turns: int, seed: int) -> dict[str, Any]:
    import openai

    rng = random.Random(seed)
    api = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=TIMEOUT_S)
    first_words = LONG_WORDS if long else SHORT_WORDS
    msgs: list[dict[str, str]] = [{"role": "user", "content": f"{tag}: " + _words(rng, first_words)}]
    first = 0.0
    done = 0
    try:
        for k in range(turns):
            t0 = time.perf_counter()
            try:
                r = await api.chat.completions.create(
                    model=SERVED,
                    messages=msgs,  # type: ignore[arg-type]
                    max_tokens=MAX_TOKENS,
                    temperature=1.0,
                    extra_body={"ignore_eos": True},  # every turn decodes MAX_TOKENS: same work on every path
                )
            except openai.APITimeoutError:  # starved past the client's patience: counted, not fatal
                return {"long": long, "first_s": first or TIMEOUT_S, "turns": done, "timed_out": True}
            if k == 0:
                first = time.perf_counter() - t0
            done += 1
            msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            await asyncio.sleep(rng.uniform(0.5, 2.0))  # the tool runs
            msgs.append({"role": "user", "content": f"tool {k}: " + _words(rng, rng.randint(30, 90))})
    finally:
        await api.close()
    return {"long": long, "first_s": first, "turns": done, "timed_out": False}


async def _engine_counts(urls: list[str]) -> dict[str, float]:
    """The engines' counters, summed."""
    from rollyard.engines.vllm import VLLMBackend

    out = dict.fromkeys(("preemptions", "hits", "queries", "prefill_tokens", "prefill_s"), 0.0)
    for url in urls:
        b = VLLMBackend(url)
        try:
            s = await b.stats()
        finally:
            await b.aclose()
        out["preemptions"] += s.preemptions
        out["hits"] += s.prefix_cache_hits
        out["queries"] += s.prefix_cache_queries
        out["prefill_tokens"] += s.prefill_tokens
        out["prefill_s"] += s.prefill_s
    return out


def _hold_p99(metrics_text: str) -> float:
    """Upper bound of the bucket holding the 99th percentile of ``rollyard_sched_hold_seconds``."""
    buckets = list(histogram_buckets(metrics_text, "rollyard_sched_hold_seconds").items())
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    total = buckets[-1][1]
    return next(le for le, n in buckets if n >= 0.99 * total)


def _counter(metrics_text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics_text.splitlines() if line.startswith(name + " "))


async def _run_path(
    path: str, engine_urls: list[str], gateway_url: str | None, n: int, turns: int, tag: str
) -> dict[str, Any]:
    pre = await _engine_counts(engine_urls)
    keys: list[tuple[str, str, str | None]] = []  # (base url, key, program id)
    admin = {"x-api-key": ADMIN}
    async with httpx.AsyncClient() as http:
        for i in range(n):
            if gateway_url is None:  # pairs (a long and a short program) spread over the engines
                keys.append((f"{engine_urls[i // 2 % len(engine_urls)]}/v1", "none", None))
                continue
            body = {"sampling": {"temperature": 1.0, "ignore_eos": True}}  # as the direct path asks
            r = await http.post(f"{gateway_url}/programs", json=body, headers=admin)
            r.raise_for_status()
            keys.append((f"{gateway_url}/v1", r.json()["api_key"], r.json()["id"]))

        async def run(i: int, base: str, key: str, pid: str | None) -> dict[str, Any]:
            """One program, finished at the gateway when it ends (as a rollout does), so its
            context stops claiming KV; a finished-but-open program held room it never used."""
            try:
                return await _program(base, key, f"{tag} {path} p{i}", i % 2 == 0, turns, _seed(tag, i))
            finally:
                if pid is not None:
                    done = await http.post(f"{gateway_url}/programs/{pid}/finish", json={}, headers=admin)
                    done.raise_for_status()

        t0 = time.perf_counter()
        progs = await asyncio.gather(*(run(i, *k) for i, k in enumerate(keys)))
    wall = time.perf_counter() - t0
    post = await _engine_counts(engine_urls)
    d = {k: post[k] - pre[k] for k in pre}
    hold, pauses = 0.0, 0.0
    if gateway_url is not None:
        text = httpx.get(f"{gateway_url}/metrics", headers={"x-api-key": ADMIN}).text
        hold, pauses = _hold_p99(text), _counter(text, "rollyard_sched_pauses_total")
    firsts = {flag: [p["first_s"] for p in progs if p["long"] is flag] for flag in (True, False)}
    return {
        "turns_per_min": 60 * sum(p["turns"] for p in progs) / wall,
        "wall_s": wall,
        "preemptions": int(d["preemptions"]),
        "hit_rate": d["hits"] / d["queries"] if d["queries"] else 0.0,
        "prefill_tokens": int(d["prefill_tokens"]),
        "prefill_s": d["prefill_s"],
        "long_short_ttft": statistics.median(firsts[True]) / max(1e-9, statistics.median(firsts[False])),
        "ttft_long_s": statistics.median(firsts[True]),
        "ttft_short_s": statistics.median(firsts[False]),
        "hold_p99_s": hold,
        "pauses": int(pauses),
        "timed_out": sum(p["timed_out"] for p in progs),
        "loadavg": loadavg(),
    }


def _orders(rounds: int, paths: tuple[str, ...] = PATHS) -> list[tuple[str, ...]]:
    """Each round's path order: forward, then reversed, then rotated, so no path always runs
    first (right after the engine is idle) or last."""
    out: list[tuple[str, ...]] = []
    for r in range(rounds):
        k = r // 2 % len(paths)
        base = paths[k:] + paths[:k]
        out.append(base if r % 2 == 0 else tuple(reversed(base)))
    return out


def main(quick: bool = False) -> None:
    n, turns, rounds = (4, 2, 1) if quick else (8, 3, 3)
    n, turns = _env_int("PROGRAMS", n), _env_int("TURNS", turns)
    rounds = _env_int("ROUNDS", rounds)
    kv_tokens, max_model_len = _env_int("KV_TOKENS", 2560), _env_int("MAX_MODEL_LEN", 2048)
    engines = _env_int("ENGINES", 1)
    size = os.environ.get("ROLLYARD_BENCH_MODEL_SIZE", "small")
    extra = tuple(x.strip() for x in os.environ.get("ROLLYARD_BENCH_EXTRA", "").split(";") if x.strip())
    paths = PATHS + extra
    per_path: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    loads = [loadavg()]
    started = time.perf_counter()
    with _engines(size, kv_tokens, max_model_len, engines) as (engine_urls, model_dir):
        for r, order in enumerate(_orders(rounds, paths)):
            for path in order:
                tag = f"round{r}"
                if path == "direct":
                    res = asyncio.run(_run_path(path, engine_urls, None, n, turns, tag))
                else:
                    policy = ["--policy", OURS if path == "rollyard" else path]
                    served = _gateway(engine_urls, model_dir, policy, model_name=SERVED, capacity=None)
                    with served as (gw, _):
                        res = asyncio.run(_run_path(path, engine_urls, gw, n, turns, tag))
                per_path[path].append(res)
                print(f"round {r} {path}: {res}", flush=True)
    loads.append(loadavg())

    def med(path: str, key: str) -> float:
        return statistics.median(x[key] for x in per_path[path])

    summary = {
        "thr_vs_vllm": med("rollyard", "turns_per_min") / med("direct", "turns_per_min"),
        "thr_vs_thunder": med("rollyard", "turns_per_min") / med("thunder", "turns_per_min"),
        "preempt_vllm": int(med("direct", "preemptions")),
        "preempt_ours": int(med("rollyard", "preemptions")),
        "long_short_ttft": med("rollyard", "long_short_ttft"),
        "hold_p99_s": med("rollyard", "hold_p99_s"),
        "hit_rate": med("rollyard", "hit_rate"),
    }
    keys = ("turns_per_min", "preemptions", "hit_rate", "prefill_tokens", "prefill_s", "long_short_ttft")
    details = {
        "programs": n,
        "turns": turns,
        "rounds": rounds,
        "kv_tokens": kv_tokens,
        "max_model_len": max_model_len,
        "model": size,
        "ours": OURS,
        "max_tokens": MAX_TOKENS,
        "timeout_s": TIMEOUT_S,
        "loadavg_start_end": loads,
        "wall_s": time.perf_counter() - started,
        "engines": len(engine_urls),
        "orders": _orders(rounds, paths),
        "per_path": per_path,
        "medians": {p: {k: med(p, k) for k in (*keys, "hold_p99_s", "pauses", "timed_out")} for p in paths},
    }
    report("programs" if len(engine_urls) == 1 else f"programs-{len(engine_urls)}engines", summary, details)
