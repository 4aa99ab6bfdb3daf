"""``rollyard report RUN_DIR``: PNG plots of the run's metrics and a short Markdown summary."""

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
        out["wall_s"] = sum(float(r.get("wall_s") or 0.0) for r in steps)
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
