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
    ("spec_acceptance_len", "mean acceptance length (drafting)", "acceptance.png"),
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
        keys = ("reward_mean", "tokens_per_s", "staleness", "trainer_idle_fraction", "turns_per_episode")
        for key in (*keys, "spec_acceptance_len"):
            vals = [float(r[key]) for r in steps if r.get(key) is not None]
            if vals:
                out[f"{key}_mean"] = statistics.fmean(vals)
    return out


def _line_plot(
    path: Path,
    lines: dict[str, tuple[list[int], list[float]]],
    *,
    xlabel: str,
    title: str | None = None,
    ylabel: str | None = None,
    ylim: tuple[float, float] | None = None,
) -> None:
    """One PNG: a line per entry of ``lines`` (labelled, with a legend, when there are several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title)
    if ylabel:
        ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _metrics(run: RunDir) -> list[dict[str, Any]]:
    rows = run.read_metrics()
    if not rows:
        raise ConfigError(f"{run.root} has no metrics.jsonl lines yet; nothing to report")
    return rows


def make_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/report/*.png`` and ``summary.md``; returns the summary path."""
    run = RunDir(run_dir)
    return _write_report(run, _metrics(run))


def _write_report(run: RunDir, rows: list[dict[str, Any]]) -> Path:
    out = run.root / "report"
    out.mkdir(exist_ok=True)
    written = []
    for key, title, name in PLOTS:
        xs, ys = _series(rows, key)
        if not xs:
            continue
        _line_plot(out / name, {key: (xs, ys)}, xlabel="step", title=title)
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
    runs = {}
    for d in run_dirs:
        run = RunDir(d)
        runs[run.root.name] = rows = _metrics(run)
        _write_report(run, rows)
    result = compare(runs)
    out.mkdir(parents=True, exist_ok=True)
    curves = {name: _series(rows, "eval_success") for name, rows in runs.items()}
    _line_plot(
        out / "heldout_success.png", curves, xlabel="RL step", ylabel="held-out success rate", ylim=(0, 1)
    )
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
