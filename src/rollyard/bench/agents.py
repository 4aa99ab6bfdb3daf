"""``rollyard bench agents``: real third-party agent CLIs as programs, N each, on the real engine.

For each CLI of ``rollyard agents install`` (mini-SWE-agent, Codex, Claude Code), ``N``
programs (``ROLLYARD_BENCH_AGENT_PROGRAMS``, default 20; ``--quick``: 4) run its shipped
runner profile, unmodified, in bubblewrap sandboxes behind one `rollyard gateway` (unix socket)
and one vLLM with room for the longest system prompt (40,960 tokens). Per CLI: its version and
API, the size of its first prompt in tokens, exit codes over the programs, turns recorded per
program, refused calls, wall time per program. This is the README's agent table; the figures
are what the CLIs do against the model served (the random tiny model by default), not a
speed claim. ``ROLLYARD_BENCH_ENGINE_URL`` + ``ROLLYARD_BENCH_MODEL_DIR`` reuse a running engine
(its context must fit the prompts). ``ROLLYARD_BENCH_AGENT_CLIS=mini-swe-agent,codex`` picks CLIs.
Every CLI picked is installed first (downloads on a first run).

``ROLLYARD_BENCH_AGENT_WARM=1``: then, per CLI, the warm start of ``rollyard train`` with
``sft.enabled`` (``rollout/sft_blackbox.py``): every prompt the CLI sent in its first N programs
is answered with its profile's ``finish`` reply and the end-of-turn token, SFT steps
(``ROLLYARD_BENCH_AGENT_SFT_STEPS``, default 100; batch 8, lr 2e-3: the tiny model then samples
mini-SWE-agent's 49-token submit call exactly at T=1) make a warm model, a fresh engine serves
it and N more programs run: ``warm`` in that CLI's results, with finish reasons before and after
(``bench/results/agents-warm.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollyard.bench._procs import ADMIN, _engine, _gateway
from rollyard.bench._report import loadavg, report
from rollyard.sandbox.base import SandboxProvider

TASK = "Create a file named hello.txt that contains the word hello, then stop."
MAX_MODEL_LEN = 40960


async def _one(name: str, url: str, sock: Path, max_tokens: int, provider: SandboxProvider) -> dict[str, Any]:
    from rollyard.agents.blackbox import BlackBoxRunner, load_profile
    from rollyard.core.trajectory import Trajectory

    headers = {"Authorization": f"Bearer {ADMIN}"}
    body = {"group_id": f"bench-{name}", "sampling": {"temperature": 1.0, "max_tokens": max_tokens}}
    async with httpx.AsyncClient(timeout=60) as c:
        prog = (await c.post(f"{url}/programs", json=body, headers=headers)).json()
    runner = BlackBoxRunner(load_profile(name), sock)
    sb = await provider.create(runner.spec())
    t0 = time.perf_counter()
    try:
        res = await runner.run(sb, task=TASK, api_key=prog["api_key"], model="tiny")
    finally:
        await sb.close()
    wall = time.perf_counter() - t0
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.get(f"{url}/programs/{prog['id']}/trajectory", headers=headers)
    traj = Trajectory.model_validate(r.json())
    refused = [e.data for e in traj.events if e.kind == "request_error"]
    first = traj.turns[0].prompt_ids if traj.num_turns else None
    return {
        "rc": res.rc,
        "timed_out": res.timed_out,
        "turns": traj.num_turns,
        "finish": [t.finish_reason.value for t in traj.turns],
        "prompts": [t.prompt_ids for t in traj.turns],  # the warm start's; not reported
        "prompt_tokens": len(first) if first else None,
        "refused": len(refused),
        "refused_codes": sorted({e["code"] for e in refused}),
        "wall_s": wall,
        "stderr_tail": res.stderr[-300:],
    }


async def _cli(name: str, url: str, sock: Path, n: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    from rollyard.sandbox.bwrap import BwrapProvider

    gate, provider = asyncio.Semaphore(concurrency), BwrapProvider()

    async def go() -> dict[str, Any]:
        async with gate:
            return await _one(name, url, sock, max_tokens, provider)

    runs = await asyncio.gather(*(go() for _ in range(n)))
    prompts = [r["prompt_tokens"] for r in runs if r["prompt_tokens"]]
    return {
        "programs": n,
        "exit_codes": dict(sorted(Counter(str(r["rc"]) for r in runs).items())),
        "exit0": sum(r["rc"] == 0 for r in runs),
        "turns_median": statistics.median(r["turns"] for r in runs),
        "turns_max": max(r["turns"] for r in runs),
        "finish_reasons": dict(sorted(Counter(f for r in runs for f in r["finish"]).items())),
        "prompt_tokens": statistics.median(prompts) if prompts else None,
        "refused_calls": sum(r["refused"] for r in runs),
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "runs": runs,
    }


def _warm_model(name: str, base_dir: Path, prompts: list[list[int]], out: Path, steps: int) -> Path:
    """The train warm start's samples and SFT path on the prompts the CLI sent."""
    from rollyard.agents.blackbox import load_profile
    from rollyard.gateway.tokenizer import FastTokenizer
    from rollyard.rollout.sft import write_demonstrations
    from rollyard.rollout.sft_blackbox import eot_samples, finish_ids
    from rollyard.train.sft import run_sft

    samples = eot_samples(prompts, finish_ids(FastTokenizer(base_dir), load_profile(name).finish))
    data = write_demonstrations(samples, out / "demos.jsonl")
    result = run_sft(base_dir, data, out, steps=steps, batch_size=8, lr=2e-3, token_budget=32768)
    print(
        f"agents {name}: warm start on {len(samples)} prompts, {steps} steps, loss {result['losses'][-1]:.4f}"
    )
    return Path(result["weights"])


@contextlib.contextmanager
def _served(engine_url: str, model_dir: Path, sock: Path) -> Iterator[tuple[str, int]]:
    """The bench gateway on ``sock``, once the socket exists."""
    with _gateway(engine_url, model_dir, ["--uds", str(sock)]) as served:
        for _ in range(300):
            if sock.exists():
                break
            time.sleep(0.1)
        yield served


def _measure(name: str, url: str, sock: Path, n: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    load = loadavg()
    res = asyncio.run(_cli(name, url, sock, n, concurrency, max_tokens))
    print(
        f"agents {name}: exit0={res['exit0']}/{n} codes={res['exit_codes']} "
        f"turns_median={res['turns_median']} finish={res['finish_reasons']} "
        f"prompt_tokens={res['prompt_tokens']}",
        flush=True,
    )
    return {"loadavg": load, **res}


def _prompts(res: dict[str, Any]) -> list[list[int]]:
    """Take the recorded prompts out of a result (they are inputs, not figures)."""
    return [p for r in res["runs"] for p in r.pop("prompts")]


def main(quick: bool = False) -> dict[str, Any]:
    from rollyard.agents.install import CLIS, install

    n = 4 if quick else int(os.environ.get("ROLLYARD_BENCH_AGENT_PROGRAMS", 20))
    concurrency, max_tokens = 4, int(os.environ.get("ROLLYARD_BENCH_AGENT_MAX_TOKENS", 64))
    names = [c for c in os.environ.get("ROLLYARD_BENCH_AGENT_CLIS", ",".join(CLIS)).split(",") if c]
    warm = os.environ.get("ROLLYARD_BENCH_AGENT_WARM", "") not in ("", "0")
    steps = int(os.environ.get("ROLLYARD_BENCH_AGENT_SFT_STEPS", 100))
    for name in names:
        install(name)
    out: dict[str, Any] = {"task": TASK, "max_tokens": max_tokens, "concurrency": concurrency, "warm": warm}
    engine = _engine(4 * MAX_MODEL_LEN, startup_timeout_s=900.0, max_model_len=MAX_MODEL_LEN)
    with tempfile.TemporaryDirectory(dir="/tmp") as d, engine as (engine_url, model_dir):
        os.chmod(d, 0o755)
        sock = Path(d) / "gw.sock"
        warmed: dict[str, Path] = {}
        with _served(engine_url, model_dir, sock) as (url, _):
            for name in names:
                cli = CLIS[name]
                out[name] = {
                    "version": cli.version,
                    "api": cli.api,
                    **_measure(name, url, sock, n, concurrency, max_tokens),
                }
                prompts = _prompts(out[name])
                if warm:
                    warmed[name] = _warm_model(name, model_dir, prompts, Path(d) / f"sft-{name}", steps)
        for name, weights in warmed.items():
            warm_engine = _engine(4 * MAX_MODEL_LEN, 900.0, MAX_MODEL_LEN, model_dir=weights)
            warm_sock = Path(d) / f"gw-{name}.sock"  # a fresh gateway, a fresh socket
            with warm_engine as (warm_url, _), _served(warm_url, weights, warm_sock) as (url, _):
                out[name]["warm"] = _measure(name, url, warm_sock, n, concurrency, max_tokens)
                _prompts(out[name]["warm"])
    summary: dict[str, Any] = {}
    for name in names:
        key = name.replace("-", "_")
        summary[f"{key}_exit0"] = f"{out[name]['exit0']}/{n}"
        summary[f"{key}_turns"] = out[name]["turns_median"]
        summary[f"{key}_prompt"] = out[name]["prompt_tokens"]
        if "warm" in out[name]:
            summary[f"{key}_warm_exit0"] = f"{out[name]['warm']['exit0']}/{n}"
            summary[f"{key}_warm_turns"] = out[name]["warm"]["turns_median"]
    return report("agents-warm" if warm else "agents", summary, out)
