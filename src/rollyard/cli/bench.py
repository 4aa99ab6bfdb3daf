"""``rollyard bench NAME``: run a benchmark module ``rollyard.bench.NAME``.

Each benchmark runs a feature and its baseline side by side in one process, writes
``bench/results/NAME.json`` and prints a last line ``NAME: key=value ...``.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

import rollyard.bench as bench_pkg
from rollyard.cli import app
from rollyard.core.errors import ConfigError


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench_pkg.__path__) if not m.name.startswith("_"))


@app.command("bench")
def bench(
    name: str = typer.Argument(..., help="benchmark name, or 'all'"),
    quick: bool = typer.Option(False, help="a smaller workload, for smoke tests"),
) -> None:
    """Run a benchmark: the feature and its baseline in one process, ratio on the last line."""
    names = available() if name == "all" else [name]
    for n in names:
        if n not in available():
            raise ConfigError(f"unknown benchmark {n!r}; available: {', '.join(available())}")
        module = importlib.import_module(f"rollyard.bench.{n}")
        module.main(quick=quick)
