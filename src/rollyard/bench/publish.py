"""``rollyard bench publish``: memory publication vs the disk reload, on two real engines.

Side by side in one process, on the same two vLLM engines and trainer model:

- quiet rounds, alternating order: a disk publish (safetensors written, both engines reload
  it) and a memory publish (gloo into both workers, nothing written), each timed whole
  (fence, transfer, load, re-pack, resume); medians and their ratio;
- bytes the trainer process wrote to storage during the memory publishes (``/proc/self/io``
  ``write_bytes``) and files left under the weights dir;
- logprobs: one model published by memory, then the same by disk, greedy logprobs on the same
  prompts from both engines compared;
- under load: 16 clients run completions back to back while memory publishes alternate two
  models every ``period`` seconds; the event loop (the one the gateway shares with the
  publisher in ``rollyard train``) is probed every 5 ms and its lag during publishes recorded;
  every completion's logprobs are recomputed by the model of the version it was stamped with
  (``mixed_version_turns``: those that match it worse than 1e-3 nats on some token, a check
  that is shown able to fail: the other model differs on every completion).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rollyard.bench._model import TINY, bench_model, result_name
from rollyard.bench._report import loadavg, report
from rollyard.core.sampling import SamplingParams
from rollyard.engines.launcher import VLLMServer
from rollyard.engines.vllm import VLLMBackend
from rollyard.rollout.services import LOGPROBS_OF_SAMPLED
from rollyard.train.publish import WeightPublisher

PROMPTS = [[1, 482, 201, 400, 483, 2, 1, 378, 201], [1, 300, 301, 302, 2, 1, 378], [1, 99, 7, 640, 2]]


def _write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _models(model_dir: Path) -> list[torch.nn.Module]:
    """Two clearly different versions of the model (seeded noise), as two trainer states."""
    from transformers import AutoModelForCausalLM

    out = []
    for seed in (1, 2):
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * p.abs().mean() * torch.randn(p.shape, generator=g))
        out.append(m)
    return out


def _logprobs_of(model: torch.nn.Module, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + ids])).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]


class LagProbe:
    """Samples the event loop's lateness every 5 ms; keeps the samples taken while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.samples: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.005)
            if self.on:
                self.samples.append(max(0.0, loop.time() - t - 0.005))


async def _greedy(engines: list[VLLMBackend]) -> list[list[float]]:
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)
    return [(await e.generate(p, params)).logprobs for e in engines for p in PROMPTS]


async def _timed(pub: WeightPublisher, model: Any, version: int, probe: LagProbe) -> float:
    probe.on = True
    t = time.perf_counter()
    await pub.publish(model, version)
    probe.on = False
    return time.perf_counter() - t


async def _run(model_dir: Path, root: Path, rounds: int, min_turns: int, period: float) -> dict[str, Any]:
    servers = [
        VLLMServer(model_dir, kv_tokens=8192, max_model_len=2048, served_name="policy",
                   log_path=root / f"engine{i}.log", extra_args=list(LOGPROBS_OF_SAMPLED))
        for i in range(2)
    ]  # fmt: skip
    try:
        await asyncio.gather(*(asyncio.to_thread(s.start) for s in servers))
        engines = [VLLMBackend(s.url, name=f"engine{i}") for i, s in enumerate(servers)]
        models = await asyncio.to_thread(_models, model_dir)
        weights = root / "weights"
        weights.mkdir()
        memory = WeightPublisher(engines, weights, base_path=model_dir, mode="memory")
        disk = WeightPublisher(engines, weights, base_path=model_dir, mode="disk", keep=1)
        await memory.start()
        probe = LagProbe()
        probing = asyncio.create_task(probe.run())
        version, disk_s, memory_s, written, parts, disk_parts = 0, [], [], 0, [], []
        for r in range(rounds):  # quiet rounds, order alternating
            for mode in ("disk", "memory") if r % 2 == 0 else ("memory", "disk"):
                version += 1
                disk.version = memory.version = version - 1
                before = _write_bytes()
                took = await _timed(memory if mode == "memory" else disk, models[version % 2], version, probe)
                (memory_s if mode == "memory" else disk_s).append(took)
                if mode == "memory":
                    written += _write_bytes() - before
                    parts.append(memory.last)
                else:
                    disk_parts.append(disk.last)
        quiet_lag = sorted(probe.samples)
        # logprobs: the same model by memory, then by disk (stamped with the disk's version)
        same = models[(version + 2) % 2]
        version += 1
        memory.version = version - 1
        await memory.publish(same, version)
        by_memory = await _greedy(engines)
        before = _write_bytes()
        version += 1
        disk.version = version - 1
        await disk.publish(same, version)
        disk_bytes = _write_bytes() - before
        by_disk = await _greedy(engines)
        pairs = zip(by_memory, by_disk, strict=True)
        diff = max(abs(a - b) for m, d in pairs for a, b in zip(m, d, strict=True))
        files_left = sorted(p.name for p in weights.iterdir())
        # under load: clients run while memory publishes every ``period`` seconds
        probe.samples = []
        memory.version = version
        stamped, drains, under_load = [], [], []
        stop = asyncio.Event()
        rng = random.Random(0)

        async def client(i: int) -> None:
            engine = engines[i % 2]
            while not stop.is_set():
                prompt = [1] + [rng.randrange(3, 2000) for _ in range(rng.randrange(4, 40))]
                params = SamplingParams(max_tokens=rng.randrange(8, 33), temperature=1.0, logprobs=True)
                c = await engine.generate(prompt, params)
                stamped.append((c.policy_version, prompt, c.token_ids, c.logprobs))

        clients = [asyncio.create_task(client(i)) for i in range(16)]
        first = version + 1
        while len(stamped) < min_turns or version < first + 3:
            await asyncio.sleep(period)
            version += 1
            under_load.append(await _timed(memory, models[version % 2], version, probe))
            drains.append(memory.last["drain_s"])
        stop.set()
        await asyncio.gather(*clients)
        probing.cancel()
        mixed, discriminated = 0, 0
        for v, prompt, ids, lps in stamped:  # every version from first - 1 on is models[v % 2]
            own = _logprobs_of(models[v % 2], prompt, ids)
            other = _logprobs_of(models[(v + 1) % 2], prompt, ids)
            mixed += max(abs(a - b) for a, b in zip(lps, own, strict=True)) > 1e-3
            discriminated += max(abs(a - b) for a, b in zip(lps, other, strict=True)) > 1e-3
        lag = sorted(probe.samples)
        reported = [await e.engine_version() for e in engines]  # what each worker says it took
        for e in engines:
            await e.aclose()
        return {
            "disk_s": disk_s, "memory_s": memory_s, "bytes_written_memory": written, "memory_parts": parts,
            "disk_parts": disk_parts,
            "bytes_written_disk_once": disk_bytes, "files_left": files_left, "logprob_diff": diff,
            "turns": len(stamped), "mixed_version_turns": mixed, "turns_other_model_differs": discriminated,
            "versions_under_load": sorted({v for v, *_ in stamped}), "publish_under_load_s": under_load,
            "fence_drain_s": drains, "lag_samples": len(lag), "final_version": version,
            "engines_report_version": reported,
            "loop_lag_p99_ms": 1000 * lag[int(0.99 * (len(lag) - 1))] if lag else 0.0,
            "loop_lag_max_ms": 1000 * lag[-1] if lag else 0.0,
            "quiet_loop_lag_p99_ms": 1000 * quiet_lag[int(0.99 * (len(quiet_lag) - 1))] if quiet_lag else 0.0,
        }  # fmt: skip
    finally:
        for s in servers:
            s.stop()


def _split(mode: str, parts: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    """``{mode}_{key}``: the median of each timing over the rounds that reported it."""
    out = {}
    for k in keys:
        values = [p[k] for p in parts if k in p]
        if values:
            out[f"{mode}_{k.removeprefix('engine_')}"] = round(statistics.median(values), 3)
    return out


def main(quick: bool = False, model: str = TINY) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-publish-") as tmp:
        model_dir = bench_model(model, Path(tmp))
        load = loadavg()
        d = asyncio.run(_run(model_dir, Path(tmp), 3 if quick else 5, 40 if quick else 200, 2.0))
    disk_s, memory_s = statistics.median(d["disk_s"]), statistics.median(d["memory_s"])
    summary = {
        "disk_s": round(disk_s, 3),
        "memory_s": round(memory_s, 3),
        "ratio": round(memory_s / disk_s, 3),
        "bytes_written_memory": d["bytes_written_memory"],
        "logprob_diff": d["logprob_diff"],
        "loop_lag_p99_ms": round(d["loop_lag_p99_ms"], 1),
        "mixed_version_turns": d["mixed_version_turns"],
        "turns": d["turns"],
        # Where each mode's time goes (medians; engine_*: the slowest engine's worker, its own clock).
        **_split(
            "memory", d["memory_parts"], ("pack_s", "engine_receive_s", "engine_load_s", "engine_repack_s")
        ),
        **_split("disk", d["disk_parts"], ("save_s", "engine_load_s", "engine_repack_s")),
        "model": model,
    }
    return report(result_name("publish", model), summary, {**d, "loadavg": load})
