"""The shared tail of every benchmark: write the JSON result, print the summary line."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(os.environ.get("ROLLYARD_BENCH_DIR", "bench/results"))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def report(name: str, summary: dict[str, Any], details: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``bench/results/NAME.json`` atomically and print ``NAME: k=v ...`` as the last line."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "summary": summary,
        "details": details or {},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.replace(tmp, path)
    print(f"{name}: " + " ".join(f"{k}={_fmt(v)}" for k, v in summary.items()), flush=True)
    return doc


def loadavg() -> str:
    """The 1/5/15-minute load averages, quoted beside every figure (these machines are shared)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"
