"""The model a benchmark serves: the tiny random model, or a pretrained one a package ships.

``rollyard bench engine --model smollm2-135m`` runs the same workload on the real model; its result
is ``bench/results/engine-smollm2-135m.json`` so the tiny model's row stays beside it.
"""

from __future__ import annotations

from pathlib import Path

TINY = "tiny"


def bench_model(name: str, tmp: Path) -> Path:
    """``tiny``: made fresh under ``tmp`` (seconds); a pretrained name: converted once, then reused."""
    if name == TINY:
        from rollyard.engines.tiny_model import create_model

        return create_model(tmp / "tiny", seed=0, size="tiny")
    from rollyard.engines.pretrained import init_pretrained

    return init_pretrained(name, Path(".cache/bench-models") / name)


def result_name(bench: str, model: str) -> str:
    return bench if model == TINY else f"{bench}-{model}"
