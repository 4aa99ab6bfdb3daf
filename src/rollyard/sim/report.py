"""A simulation's report directory: ``summary.md`` (one row per policy), ``results.json`` and
PNG plots of throughput, KV usage over time, pause hold times and the latency tail, one line
per policy on each plot (the same shape as ``rollyard report``'s run reports)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from rollyard.sim.result import SimResult

__all__ = ["TABLE_KEYS", "write_report"]

TABLE_KEYS = (
    "output_tok_s",
    "makespan_s",
    "req_p50_s",
    "req_p99_s",
    "program_p50_s",
    "program_p99_s",
    "kv_usage_mean",
    "preemptions",
    "prefix_hit_rate",
    "pauses",
    "hold_p99_s",
    "gateway_util",
    "gateway_wait_p99_s",
    "trainer_idle",
    "train_step_s",
    "publish_share",
    "staleness_mean",
    "wall_s",
)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _plot(path: Path, lines: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, label=label, linewidth=1.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    s = sorted(values)
    n = len(s)
    return s, [(i + 1) / n for i in range(n)]


def _throughput(r: SimResult) -> tuple[list[float], list[float]]:
    rows = r.stats.series
    xs, ys = [], []
    for a, b in itertools.pairwise(rows):
        dt = b[0] - a[0]
        if dt > 0:
            xs.append(b[0])
            ys.append((b[5] - a[5]) / dt)
    k = max(1, len(xs) // 100)  # smooth to about 100 points
    return xs[k - 1 :: k], [sum(ys[i : i + k]) / k for i in range(0, len(ys) - k + 1, k)]


def write_report(out: Path, results: list[SimResult]) -> Path:
    """Write the report directory; returns ``summary.md``."""
    out.mkdir(parents=True, exist_ok=True)
    label = {id(r): r.policy for r in results}
    plots = {
        "throughput.png": (
            {label[id(r)]: _throughput(r) for r in results},
            "simulated s",
            "output tokens / s",
        ),
        "kv_usage.png": (
            {label[id(r)]: ([s[0] for s in r.stats.series], [s[1] for s in r.stats.series]) for r in results},
            "simulated s",
            "mean KV usage",
        ),
        "tail.png": (
            {label[id(r)]: _cdf(r.stats.program_latency) for r in results if r.stats.program_latency},
            "program latency, s",
            "fraction of programs done",
        ),
        "hold_times.png": (
            {label[id(r)]: _cdf(r.stats.hold_s) for r in results if r.stats.hold_s},
            "pause hold time, s",
            "fraction of pauses",
        ),
    }
    written = []
    for name, (lines, xl, yl) in plots.items():
        if lines:
            _plot(out / name, lines, xl, yl)
            written.append(name)
    first = results[0]
    head = f"# rollyard sim: {first.workload} on {first.engines} x {first.profile}"
    table = ["| policy | " + " | ".join(TABLE_KEYS) + " |", "| --- " * (len(TABLE_KEYS) + 1) + "|"]
    for r in results:
        table.append(f"| {r.policy} | " + " | ".join(_fmt(r.summary.get(k, "")) for k in TABLE_KEYS) + " |")
    text = "\n".join([head, "", *table, "", *[f"![{n}]({n})" for n in written], ""])
    _write(out / "results.json", json.dumps([_doc(r) for r in results], indent=2, sort_keys=True))
    path = out / "summary.md"
    _write(path, text)
    return path


def _doc(r: SimResult) -> dict[str, Any]:
    return {
        "workload": r.workload,
        "policy": r.policy,
        "profile": r.profile,
        "engines": r.engines,
        "summary": r.summary,
    }
