"""``rollyard bench NAME``: run a benchmark module ``rollyard.bench.NAME``.

Each benchmark runs a feature and its baseline side by side in one process, writes
``bench/results/NAME.json`` and prints a last line ``NAME: key=value ...``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

import typer

import rollyard.bench as bench_pkg
from rollyard.cli import app
from rollyard.core.errors import ConfigError
from rollyard.engines.pretrained import PRETRAINED


def available() -> list[str]:
    """Benchmark names: the modules of ``rollyard.bench``, ``_`` written ``-`` (``trainer-scale``)."""
    mods = pkgutil.iter_modules(bench_pkg.__path__)
    return sorted(m.name.replace("_", "-") for m in mods if not m.name.startswith("_"))


@app.command("bench")
def bench(
    name: str = typer.Argument(..., help="benchmark name, or 'all'"),
    quick: bool = typer.Option(False, help="a smaller workload, for smoke tests"),
    model: str = typer.Option(
        "tiny", help="engine and e2e: the model served, tiny or a pretrained name (smollm2-135m)"
    ),
    ray_nodes: int = typer.Option(
        1, "--ray-nodes", min=1, max=2, help="e2e: 2 runs it also on two namespaced Ray nodes, side by side"
    ),
    steps: int | None = typer.Option(
        None, min=1, help="offpolicy, drafting, drafting-eagle: training steps per run"
    ),
    seeds: int | None = typer.Option(None, min=1, help="offpolicy: seeds (warm starts) per config"),
    work: Path | None = typer.Option(
        None,
        help="offpolicy, drafting-eagle: keep every run and its finished row in DIR; a rerun with "
        "the same DIR reuses the rows made under the same settings and runs the rest",
    ),
    max_runs: int | None = typer.Option(
        None, "--max-runs", min=1, help="offpolicy, drafting-eagle: stop after N new runs (with --work)"
    ),
) -> None:
    """Run a benchmark: the feature and its baseline in one process, ratio on the last line."""
    # ``all`` leaves out a benchmark that another runs in full (``PART_OF``: drafting-eagle)
    names = [n for n in available() if not _part_of(n)] if name == "all" else [name]
    for n in names:
        if n not in available():
            raise ConfigError(f"unknown benchmark {n!r}; available: {', '.join(available())}")
    if model != "tiny" and model not in PRETRAINED:
        raise ConfigError(f"unknown model {model!r}; choose tiny or one of: {', '.join(sorted(PRETRAINED))}")
    modules = [importlib.import_module(f"rollyard.bench.{n.replace('-', '_')}") for n in names]
    takes_model = [m for m in modules if "model" in inspect.signature(m.main).parameters]
    if model != "tiny" and len(takes_model) < len(modules):
        fixed = ", ".join(m.__name__.rsplit(".", 1)[1] for m in modules if m not in takes_model)
        raise ConfigError(f"--model applies to engine and e2e only; {fixed} serve their own model")
    if ray_nodes != 1 and names != ["e2e"]:
        raise ConfigError("--ray-nodes applies to e2e only")
    given = {"steps": steps, "seeds": seeds, "work": work, "max_runs": max_runs}
    sizes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    for key in sizes:
        if any(key not in inspect.signature(m.main).parameters for m in modules):
            takes = [n for n in available() if key in _parameters(n)]
            raise ConfigError(f"--{key.replace('_', '-')} applies to {', '.join(takes)} only")
    if max_runs is not None and work is None:
        raise ConfigError("--max-runs needs --work DIR: the runs it stops before are done by a later call")
    if ray_nodes != 1:
        sizes["ray_nodes"] = ray_nodes
    for m in modules:
        m.main(quick=quick, **({"model": model} if m in takes_model else {}), **sizes)


def _parameters(name: str) -> set[str]:
    """What benchmark ``name``'s ``main`` takes."""
    module = importlib.import_module(f"rollyard.bench.{name.replace('-', '_')}")
    return set(inspect.signature(module.main).parameters)


def _part_of(name: str) -> str | None:
    """The benchmark that also runs benchmark ``name`` whole, if any."""
    module = importlib.import_module(f"rollyard.bench.{name.replace('-', '_')}")
    return getattr(module, "PART_OF", None)
