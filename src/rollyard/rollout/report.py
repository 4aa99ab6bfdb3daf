"""``rollyard report RUN_DIR [RUN_DIR ...]``: PNG plots of a run's metrics and a short Markdown
summary; given several runs (the demo's seeds), also one held-out curve per run on a shared plot
and a table of their start, end and gain, so the learning claim is read off one file."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.rollout.rundir import RunDir, write_atomic

PLOTS = (
    ("reward_mean", "train reward (mean)", "reward.png"),
    ("eval_success", "held-out success rate", "heldout_success.png"),
    ("tokens_per_s", "tokens / s", "tokens_per_s.png"),
    ("staleness", "staleness (versions)", "staleness.png"),
    ("turns_per_episode", "turns per episode", "turns.png"),
)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers a reader wants first: held-out success at the start and end, and their gap."""
    evals = [r for r in rows if r.get("eval_success") is not None]
    steps = [r for r in rows if int(r.get("step", 0)) > 0]
    out: dict[str, Any] = {"steps": max((int(r["step"]) for r in rows), default=0)}
    if evals:
        out["eval_start"] = evals[0]["eval_success"]
        out["eval_end"] = evals[-1]["eval_success"]
        out["eval_best"] = max(r["eval_success"] for r in evals)
        out["eval_gain_points"] = 100.0 * (out["eval_end"] - out["eval_start"])
    if steps:
        out["rl_steps_wall_s"] = sum(float(r.get("wall_s") or 0.0) for r in steps)  # not SFT, evals, start-up
        for key in ("reward_mean", "tokens_per_s", "staleness", "trainer_idle_fraction", "turns_per_episode"):
            vals = [float(r[key]) for r in steps if r.get(key) is not None]
            if vals:
                out[f"{key}_mean"] = statistics.fmean(vals)
    return out


def make_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/report/*.png`` and ``summary.md``; returns the summary path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunDir(run_dir)
    rows = run.read_metrics()
    if not rows:
        raise ConfigError(f"{run_dir} has no metrics.jsonl lines yet; nothing to report")
    out = run.root / "report"
    out.mkdir(exist_ok=True)
    written = []
    for key, title, name in PLOTS:
        xs, ys = _series(rows, key)
        if not xs:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(name)
    s = summarize(rows)
    lines = [f"# rollyard run {run.root.name}", ""]
    lines += [f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in s.items()]
    lines += ["", *[f"![{n}]({n})" for n in written], ""]
    path = out / "summary.md"
    write_atomic(path, "\n".join(lines))
    return path


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per run and averaged: held-out success at the start and end and the gain in points."""
    per_run = {name: summarize(rows) for name, rows in runs.items()}
    evaluated = {n: s for n, s in per_run.items() if "eval_start" in s}
    out: dict[str, Any] = {"runs": per_run}
    if evaluated:
        for key in ("eval_start", "eval_end", "eval_gain_points"):
            out[f"{key}_mean"] = statistics.fmean(s[key] for s in evaluated.values())
    return out


def make_comparison(run_dirs: list[Path], out: Path) -> Path:
    """Each run's own report, plus ``out/heldout_success.png`` (one line per run) and ``out/summary.md``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for d in run_dirs:
        make_report(d)
        runs[RunDir(d).root.name] = RunDir(d).read_metrics()
    result = compare(runs)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, rows in runs.items():
        xs, ys = _series(rows, "eval_success")
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "heldout_success.png", dpi=100)
    plt.close(fig)
    lines = [
        "| run | held-out start | held-out end | gain (points) | RL steps wall (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s in result["runs"].items():
        cells = [f"{s[k]:.3f}" if k in s else "-" for k in ("eval_start", "eval_end")]
        cells += [f"{s[k]:.1f}" if k in s else "-" for k in ("eval_gain_points", "rl_steps_wall_s")]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    if "eval_gain_points_mean" in result:
        lines.append(
            f"| mean | {result['eval_start_mean']:.3f} | {result['eval_end_mean']:.3f} "
            f"| {result['eval_gain_points_mean']:.1f} | |"
        )
    path = out / "summary.md"
    write_atomic(
        path, "\n".join(["# rollyard runs compared", "", *lines, "", "![held-out](heldout_success.png)", ""])
    )
    return path
