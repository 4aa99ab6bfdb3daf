"""``rollyard bench drafting-eagle``: the learned eagle head against itself frozen and against
grouped suffix drafting, over an RL run of the reading demo (the eagle rows of ``rollyard bench
drafting``, which runs them after its suffix engines; this name runs them alone).

Three whole ``rollyard train`` runs of ``configs/demo-smollm2.yaml``, one after another, each
starting its own engine: ``engine.drafting`` ``{method: eagle, head: auto, online: true}``, the
same with ``online: false`` (the head frozen after its warm-up; its shared embeddings and
``lm_head`` still follow the policy), and ``{method: grouped_suffix}``; all with k = ``K``,
``publish.mode: disk`` and no held-out evaluation. Every run starts from the demo's cached SFT
warm start (``bench._readout``): the run dir's ``sft/`` is given that model and demonstrations
made as the warm start made its own (once, beside it, by the demo's own
``rollout.sft.demonstrations``), so the run skips the SFT but ``head: auto`` warm-trains the head
on those demonstrations with its default ``warm_steps`` inside the run, cached under the model
cache (the frozen run reuses the online run's warm-up). Acceptance length (``spec_acceptance_len``
in each step's metrics row) is read at the first and last step.

Then the online run's last version (its policy and the head trained with it, ``draft_head/``)
is served twice, with and without the head, on the agent turns of ``bench.drafting`` (G = 16
samples per turn at T = 1, at 4 and 16 concurrent): decode tok/s with / without, and T = 0
outputs compared.

``--work DIR``: the three runs live in DIR (the online run's last version kept for decode) and each
finished one's row is kept there, so the bench can be measured in pieces (``--max-runs N`` new runs
per call; ``bench._resume``); the decode comparison is measured anew by the call that finds all three.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollyard.bench._readout import agent_turns, sft_config, sft_key, sft_model
from rollyard.bench._report import loadavg, report
from rollyard.bench._resume import Rows, config_hash, shed, work_dir
from rollyard.core.errors import TrainError
from rollyard.engines.drafting import DraftingConfig
from rollyard.engines.drafting.eagle_files import HEAD_DIR
from rollyard.rollout.config import Config, builtin_config

log = logging.getLogger(__name__)

PART_OF = "drafting"  # whose run includes these rows: ``rollyard bench all`` runs them there only
K = 4  # as the suffix rows of bench.drafting
STEPS = 20  # the run length (``--steps``)
# --quick's head warm-up: a head step on 4 rows of ~500 tokens took 9-15 s here (2 shared cores),
# so the default 200 is ~40 min, on top of the 32 demonstrations' policy forward (~9 s each)
QUICK_WARM_STEPS = 20
DEMO = "demo-smollm2"
# bump when the way a run or its row is made changes (``train_run``, ``summarize``, the demos):
# part of a stored row's key (``--work``), so a row of older code is not reused
ROWS = 1
RUNS: dict[str, dict[str, Any]] = {
    "online": {"method": "eagle", "k": K, "head": "auto", "online": True},
    "frozen": {"method": "eagle", "k": K, "head": "auto", "online": False},
    "grouped": {"method": "grouped_suffix", "k": K},
}


def demos(model: Path) -> Path:
    """Demonstrations as the demo's warm start makes them (its recipe and seed, the cached
    warm start's tasks), made once beside the cached model: what ``head: auto`` warm-trains on."""
    out = model.parent / "demos.jsonl"
    if out.is_file():
        return out
    from rollyard.rollout.config import resolve_paths
    from rollyard.rollout.services import make_provider
    from rollyard.rollout.sft import demonstrations, write_demonstrations
    from rollyard.tasks import load_tasks

    cfg = sft_config()
    tasks = load_tasks(model.parent / "tasks" / "train")
    with tempfile.TemporaryDirectory(prefix="rollyard-demos-") as tmp:
        cfg = resolve_paths(cfg.model_copy(deep=True), Path(tmp))
        provider = make_provider(cfg, Path(tmp))
        samples = asyncio.run(demonstrations(tasks, provider, model, cfg, cfg.run.seed))
    return write_demonstrations(samples, out)


def run_config(name: str, model: Path, steps: int, quick: bool) -> Config:
    """The demo's config for run ``name``: its drafting, ``steps`` steps, no held-out evaluation."""
    overrides: dict[str, Any] = {
        "model.path": str(model),
        "model.create": False,
        "model.pretrained": None,
        "tasks.validate_tasks": False,  # the cached warm start's tasks were validated when made
        "tasks.eval": None,
        "run.steps": steps,
        "run.progress": False,
        "run.checkpoint_every": steps,
        # every step's groups sampled after the previous publish, so step n's acceptance is the
        # head of version n - 1: asynchronously (8 groups in flight) a 2-step quick run sampled
        # all its groups in step 1's window and step 2 drafted nothing
        "run.mode": "sync",
        "publish.mode": "disk",  # the last version's weights and head stay on disk, to serve after
        "engine.drafting": RUNS[name],
    }
    if quick:
        overrides |= {"run.groups_per_step": 2}
        if RUNS[name]["method"] == "eagle":
            overrides["engine.drafting"] = {**RUNS[name], "warm_steps": QUICK_WARM_STEPS}
    return builtin_config(DEMO, overrides)


def _prepare(root: Path, model: Path, demo_file: Path) -> None:
    """The run dir's ``sft/`` as the warm start leaves it: the model, then the demonstrations."""
    sft = root / "sft"
    sft.mkdir(parents=True)
    (sft / "v000000").symlink_to(model, target_is_directory=True)
    shutil.copyfile(demo_file, sft / "demos.jsonl")


def train_run(
    name: str, root: Path, model: Path, demo_file: Path, steps: int, quick: bool
) -> list[dict[str, Any]]:
    """One whole ``rollyard train`` run; its metrics rows."""
    from rollyard.rollout.config import resolve_paths
    from rollyard.rollout.orchestrator import train
    from rollyard.rollout.rundir import RunDir

    _prepare(root, model, demo_file)
    run = RunDir(root)
    asyncio.run(train(resolve_paths(run_config(name, model, steps, quick), root), run))
    rows = [r for r in run.read_metrics() if r.get("step", 0) > 0]
    if not rows:
        raise TrainError(f"the {name} run recorded no training step: see {root / 'logs'}")
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's acceptance at the first and last step that drafted, and the head's loss where
    it trained. A step whose window saw no draft (its groups were all sampled before the
    previous step ended, as an asynchronous run allows) has no acceptance length, not 1."""

    def at(r: dict[str, Any]) -> float | None:
        return float(r["spec_acceptance_len"]) if r.get("spec_drafts") else None

    drafted = [r for r in rows if r.get("spec_drafts")]
    out: dict[str, Any] = {
        "steps": len(rows),
        "accept_first": at(drafted[0]) if drafted else None,
        "accept_last": at(drafted[-1]) if drafted else None,
        "first_drafted_step": drafted[0]["step"] if drafted else None,
        "last_drafted_step": drafted[-1]["step"] if drafted else None,
        "accept_per_step": [at(r) for r in rows],
        "drafts_per_step": [r.get("spec_drafts") for r in rows],
        "success_per_step": [r.get("success_rate") for r in rows],
        "step_wall_s": [r.get("wall_s") for r in rows],
    }
    if "draft_head_loss" in rows[0]:
        out["head_kl_per_step"] = [r.get("draft_head_loss") for r in rows]
        out["head_top1_per_step"] = [r.get("draft_head_top1") for r in rows]
    return out


def decode(final: Path, turns_from: Path, levels: list[int]) -> dict[str, Any]:
    """The online run's last version served without and with its head on ``bench.drafting``'s
    workload (G samples per agent turn of the cached warm start's tasks, ``turns_from``):
    decode tok/s per level and the T = 0 outputs of each."""
    from rollyard.bench.drafting import MAX_TOKENS, TASKS_PER_LEVEL, _run_engine

    head = final / HEAD_DIR
    if not head.is_dir():
        raise TrainError(f"the online run's last version {final} has no {HEAD_DIR}/")
    tasks = agent_turns(turns_from, 1 + TASKS_PER_LEVEL * len(levels))
    greedy_prompts = tasks[0][:1]
    per = TASKS_PER_LEVEL
    level_prompts = {
        c: [turn for task in tasks[1 + i * per : 1 + (i + 1) * per] for turn in task]
        for i, c in enumerate(levels)
    }
    out: dict[str, Any] = {"weights": final.name}
    for label, drafting in (
        ("none", DraftingConfig()),
        ("eagle", DraftingConfig(method="eagle", head=str(head), k=K)),
    ):
        greedy, runs = _run_engine(final, drafting, greedy_prompts, level_prompts, MAX_TOKENS)
        for r in runs.values():
            r.pop("outputs")
        out[label] = {"greedy": greedy, "levels": {str(c): r for c, r in runs.items()}, "load1": loadavg()}
    return out


def summary(details: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys from what has run so far (a run not done yet is left out)."""
    runs, out = details["runs"], {}
    for name in RUNS:
        if name in runs:
            out[f"accept_{name}_first"] = runs[name]["accept_first"]
            out[f"accept_{name}_last"] = runs[name]["accept_last"]
    # only at one same step after the first: step 1 of both is drafted by the same warm head
    # (version 0's), so a difference there measures nothing of the online training
    on, fr = runs.get("online", {}), runs.get("frozen", {})
    at = on.get("last_drafted_step")
    if (
        None not in (on.get("accept_last"), fr.get("accept_last"), at)
        and at == fr.get("last_drafted_step") > 1
    ):
        out["online_minus_frozen_last"] = on["accept_last"] - fr["accept_last"]
        out["online_minus_frozen_step"] = at
    d = details.get("decode")
    if d:
        for c, r in d["eagle"]["levels"].items():
            out[f"tok_s_ratio_online_{c}"] = r["tok_s"] / d["none"]["levels"][c]["tok_s"]
        out["eagle_t0_identical"] = d["eagle"]["greedy"] == d["none"]["greedy"]
    out["eagle_steps"] = details["steps"]
    # a bench cut short, or one piece of it (``--work``/``--max-runs``), says what it lacks
    missing = [n for n in RUNS if n not in runs] + ([] if d else ["decode"])
    if missing:
        out["eagle_missing"] = ",".join(missing)
    return out


def run_key(name: str, steps: int, quick: bool) -> dict[str, Any]:
    """What decides run ``name``: a stored row made under another key is not reused."""
    cfg = run_config(name, Path("warm-start"), steps, quick)
    return {
        "bench": "drafting-eagle",
        "run": name,
        "steps": steps,
        "quick": quick,
        "k": K,
        "drafting": cfg.engine.drafting.model_dump(mode="json"),  # method, online, warm_steps...
        "demo": DEMO,
        "rows": ROWS,
        "warm_start": sft_key(sft_config()),  # the cached warm start's own key
        "run_config": config_hash(cfg),  # the whole demo config as run
    }


def last_version(root: Path) -> Path | None:
    """The online run's last published version, if it is there with its head: what decode serves."""
    finals = sorted((root / "weights").glob("v*"))
    return finals[-1] if finals and (finals[-1] / HEAD_DIR).is_dir() else None


def eagle_rows(
    quick: bool,
    steps: int,
    done: Callable[[dict[str, Any], dict[str, Any]], None],
    work: Path | None = None,
    max_runs: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three runs (``work``: finished ones reused, see ``bench._resume``; at most ``max_runs``
    new ones), then, once all three are there, the decode comparison (always measured anew);
    ``done(summary, details)`` after each, so a bench cut short keeps what it measured."""
    t0 = time.perf_counter()
    levels = [4, 16]  # the issue's; --quick too (about 3 min of the run)
    model = sft_model()  # the first run warm-starts it (minutes); later runs reuse the cache
    demo_file = demos(model)
    details: dict[str, Any] = {
        "workload": f"configs/{DEMO}.yaml from its cached SFT warm start, publish.mode disk, "
        f"no held-out evaluation, k = {K}" + (", 2 groups per step" if quick else ""),
        "drafting": RUNS,
        "steps": steps,
        "levels": levels,
        "runs": {},
        "loadavg": [loadavg()],
    }
    runs = details["runs"]
    with work_dir(work, "rollyard-bench-eagle-") as root:
        store = Rows(root if work is not None else None)
        keys = {name: run_key(name, steps, quick) for name in RUNS}
        for name in RUNS:
            if name == "online" and work is not None and last_version(root / name) is None:
                if (root / f"{name}.json").is_file():
                    log.warning("%s has no last version and head to serve: the run is redone", root / name)
                continue
            row = store.load(name, keys[name])
            if row is not None:
                runs[name] = row
        todo = [n for n in RUNS if n not in runs][:max_runs]
        store.announce("drafting-eagle", todo)

        def write() -> None:
            details.update(store.details(), wall_s=time.perf_counter() - t0)
            details["loadavg"].append(loadavg())
            done(summary(details), details)

        for name in todo:
            run_dir = root / name
            shutil.rmtree(run_dir, ignore_errors=True)  # cut short, or made under another key
            t = time.perf_counter()
            got = train_run(name, run_dir, model, demo_file, steps, quick)
            row = {"wall_s": time.perf_counter() - t, **summarize(got)}
            runs[name] = store.save(name, keys[name], row)
            shed(run_dir, weights=name != "online")  # decode serves the online run's last version
            write()
        if all(n in runs for n in RUNS):
            final = last_version(root / "online")
            if final is None:
                raise TrainError(f"{root / 'online'} has no last version with its {HEAD_DIR}/ to serve")
            t = time.perf_counter()
            details["decode"] = decode(final, model, levels)
            details["decode"]["wall_s"] = time.perf_counter() - t
            write()
    return summary(details), details


def main(
    quick: bool = False, steps: int | None = None, work: Path | None = None, max_runs: int | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {}

    def done(s: dict[str, Any], d: dict[str, Any]) -> None:
        nonlocal doc
        doc = report("drafting-eagle", s, d)

    eagle_rows(quick, steps or (2 if quick else STEPS), done, work, max_runs)
    return doc
