"""``rollyard bench offpolicy``: the reading demo trained off-policy on purpose, with each of the
trainer's off-policy corrections, against no correction and against on-policy training.

Workload: ``configs/demo-smollm2.yaml`` (SmolLM2-135M-Instruct after its SFT warm start, ``readout``
tasks, PPO + GRPO, the top 8 layers trained) with a deliberately high learning rate (``LR``, 10x the
demo's) and ``buffer.max_staleness: 4`` with enough groups in flight (16) for samples up to four
versions old to reach the trainer. Configs, one run each per seed, in this order on one engine
(put back on the warm start's weights between runs):

- ``onpolicy``: ``run.mode: sync`` (every step's groups sampled by the policy being trained);
- ``none``: asynchronous, no correction (the PPO ratio is against the recorded logprobs);
- ``token_tis``, ``seq_tis``, ``seq_mis``: the weight kinds, with ``trainer.decoupled: true``;
- ``geo_mask``, ``icepop``: the mask kinds (ratio against the recorded logprobs, as ``none``).

Reported per config: held-out success at the end (mean over seeds), after the warm start (the
step-0 evaluation each run makes of the same start), and the worst per-step KL: the largest
``train_behaviour_kl`` of any step of any seed, the k3 estimate of KL(mu || pi_prox) between the
policy that sampled a step's tokens and the one trained on them, measured before any correction
acts (so it is comparable across configs). No threshold is set in advance.

``--quick``: 1 seed, 2 steps, 2 groups per step, 8 held-out tasks x 2 samples; ``--steps`` and
``--seeds`` override either size. The warm start per seed is cached (``bench._readout``).
``--work DIR``: the runs live in DIR and each finished one's row is kept there, so the full size
can be measured in pieces (``--max-runs N`` new runs per call; ``bench._resume``).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollyard.bench._readout import sft_key, sft_model
from rollyard.bench._report import loadavg, report
from rollyard.bench._resume import Rows, config_hash, shed, work_dir
from rollyard.core.errors import TrainError
from rollyard.rollout.config import Config, builtin_config

CONFIGS = ("onpolicy", "none", "token_tis", "seq_tis", "seq_mis", "geo_mask", "icepop")
LR = 5.0e-5  # the demo trains at 5e-6; 2e-5 on every layer broke its tool-call JSON in 5 steps
STALENESS = 4
IN_FLIGHT = 16
DEMO = "demo-smollm2"
# bump when the way a run or its row is made changes (``_train``, ``summarize``, the engine's
# flags): part of a stored row's key (``--work``), so a row of older code is not reused
ROWS = 1


def run_overrides(name: str, model: Path, url: str, steps: int, seed: int, quick: bool) -> dict[str, Any]:
    """The demo config's changes for config ``name`` (the warm start given, the engine shared)."""
    out: dict[str, Any] = {
        "model.path": str(model),
        "model.create": False,
        "model.pretrained": None,
        "engine.urls": [url],
        "sft.enabled": False,  # the warm start is ``model``
        "tasks.validate_tasks": False,  # the demo's own runs validate the same generated tasks
        "run.seed": seed,
        "run.steps": steps,
        "run.progress": False,
        "run.max_groups_in_flight": IN_FLIGHT,
        "run.checkpoint_every": steps,
        "eval.every": steps,  # at the warm start and the end
        "trainer.lr": LR,
        "buffer.max_staleness": STALENESS,
    }
    if quick:
        out |= {"run.groups_per_step": 2, "tasks.eval.n": 8, "eval.samples": 2}
    if name == "onpolicy":
        out["run.mode"] = "sync"
    elif name != "none":
        out["trainer.correction"] = {"kind": name}
        out["trainer.decoupled"] = name in ("token_tis", "seq_tis", "seq_mis")  # weights need it
    return out


def seed_config(seed: int) -> Config:
    """The demo's config at ``seed``: what decides the cached warm start."""
    return builtin_config(DEMO, {"run.seed": seed})


async def _train(cfg: Config, root: Path) -> list[dict[str, Any]]:
    from rollyard.rollout.config import resolve_paths
    from rollyard.rollout.orchestrator import train
    from rollyard.rollout.rundir import RunDir

    run = RunDir(root)
    await train(resolve_paths(cfg, root), run)
    return run.read_metrics()


async def _restore(url: str, model: Path) -> None:
    """The engine back on the warm start's weights, version 0, for the next run."""
    from rollyard.engines.vllm import VLLMBackend

    backend = VLLMBackend(url)
    try:
        await backend.load_weights(str(model), 0)
    finally:
        await backend.aclose()


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures from its metrics rows (step 0: the start's evaluation)."""
    steps = [r for r in rows if r["step"] > 0]
    if not steps:
        raise TrainError("an offpolicy run recorded no training step: see its run dir's logs")
    return {
        "start_success": rows[0].get("eval_success"),
        "end_success": rows[-1].get("eval_success"),
        "worst_kl": max(r.get("train_behaviour_kl", 0.0) for r in steps),
        "worst_loss_kl": max(r.get("train_kl", 0.0) for r in steps),
        "mean_staleness": statistics.fmean(r.get("staleness", 0.0) for r in steps),
        "max_grad_norm": max(r.get("train_grad_norm", 0.0) for r in steps),
        "masked_frac_mean": statistics.fmean(r.get("train_is_masked_frac", 0.0) for r in steps),
        "truncated_frac_mean": statistics.fmean(r.get("train_is_truncated_frac", 0.0) for r in steps),
        "steps": len(steps),
    }


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    done = [n for n in CONFIGS if runs.get(n)]
    out: dict[str, Any] = {}
    for n in done:
        out[n] = statistics.fmean(r["end_success"] for r in runs[n])
    out["start"] = statistics.fmean(r["start_success"] for n in done for r in runs[n]) if done else 0.0
    for n in done:
        out[f"worst_kl_{n}"] = max(r["worst_kl"] for r in runs[n])
    out["seeds"] = max((len(runs[n]) for n in done), default=0)
    out["steps"] = max((r["steps"] for n in done for r in runs[n]), default=0)
    return out


def run_key(name: str, seed: int, steps: int, quick: bool) -> dict[str, Any]:
    """What decides run ``name`` at ``seed``: a stored row made under another key is not reused."""
    cfg = builtin_config(DEMO, run_overrides(name, Path("warm-start"), "http://engine", steps, seed, quick))
    return {
        "bench": "offpolicy",
        "config": name,
        "seed": seed,
        "steps": steps,
        "quick": quick,
        "lr": LR,
        "staleness": STALENESS,
        "in_flight": IN_FLIGHT,
        "demo": DEMO,
        "rows": ROWS,
        "warm_start": sft_key(seed_config(seed)),  # the cached warm start's own key
        "run_config": config_hash(cfg),  # the whole demo config as run
    }


@contextmanager
def _engine(seed: int, root: Path) -> Iterator[tuple[Path, str]]:
    """Seed ``seed``'s warm start (cached; made first if not) served by one vLLM that records the
    sampled distribution's logprobs: the warm start's path and the engine's URL."""
    from rollyard.engines.launcher import VLLMServer
    from rollyard.rollout.services import LOGPROBS_OF_SAMPLED

    base = seed_config(seed)
    warm = sft_model(base)  # the first run per seed warm-starts it (minutes); then cached
    with VLLMServer(
        warm,
        kv_tokens=base.engine.kv_tokens,
        max_model_len=base.engine.max_model_len,
        served_name="policy",
        log_path=root / f"vllm-seed{seed}.log",
        extra_args=list(LOGPROBS_OF_SAMPLED),
    ) as server:
        yield warm, server.url


def main(
    quick: bool = False,
    steps: int | None = None,
    seeds: int | None = None,
    work: Path | None = None,
    max_runs: int | None = None,
) -> dict[str, Any]:
    """Every seed x config run (``work``: finished ones reused, see ``bench._resume``; at most
    ``max_runs`` new ones), then the summary of every row there is."""
    steps = steps or (2 if quick else 20)
    seeds = seeds or (1 if quick else 3)
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in CONFIGS}
    details: dict[str, Any] = {
        "workload": f"configs/{DEMO}.yaml, lr {LR}, buffer.max_staleness {STALENESS}, "
        f"{IN_FLIGHT} groups in flight; onpolicy = run.mode sync",
        "quick": quick,
        "runs": runs,
        "loadavg": [],
    }
    with work_dir(work, "rollyard-bench-offpolicy-") as root:
        store = Rows(root if work is not None else None)
        got: dict[tuple[int, str], dict[str, Any]] = {}
        keys = {(s, n): run_key(n, s, steps, quick) for s in range(seeds) for n in CONFIGS}
        for (seed, name), key in keys.items():
            row = store.load(f"{seed}-{name}", key)
            if row is not None:
                got[seed, name] = row
        todo = [(s, n) for s in range(seeds) for n in CONFIGS if (s, n) not in got][:max_runs]
        store.announce("offpolicy", [f"{s}-{n}" for s, n in todo])

        def write() -> dict[str, Any]:
            for n in CONFIGS:  # seed order, as one uninterrupted call appends them
                runs[n][:] = [got[s, n] for s in range(seeds) if (s, n) in got]
            missing = [f"{s}-{n}" for s in range(seeds) for n in CONFIGS if (s, n) not in got]
            details.update(store.details(), missing_runs=missing, wall_s=time.perf_counter() - t0)
            summary = _summary(runs)
            if missing:  # a piece, not the whole: its means are over the seeds each config has so far
                summary["partial"] = f"{seeds * len(CONFIGS) - len(missing)}/{seeds * len(CONFIGS)}"
            return report("offpolicy", summary, details)

        for seed in sorted({s for s, _ in todo}):
            with _engine(seed, root) as (warm, url):
                for name in [n for s, n in todo if s == seed]:
                    cfg = builtin_config(DEMO, run_overrides(name, warm, url, steps, seed, quick))
                    run_dir = root / f"seed{seed}-{name}"
                    shutil.rmtree(run_dir, ignore_errors=True)  # cut short, or made under another key
                    t = time.perf_counter()
                    try:
                        rows = asyncio.run(_train(cfg, run_dir))
                    finally:
                        asyncio.run(_restore(url, warm))
                    row = {"seed": seed, "wall_s": time.perf_counter() - t, **summarize(rows)}
                    got[seed, name] = store.save(f"{seed}-{name}", keys[seed, name], row)
                    shed(run_dir)
                    details["loadavg"].append(loadavg())
                    write()  # after every run, so a bench cut short keeps what it measured
        return write()
