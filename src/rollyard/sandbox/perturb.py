"""Diversity (ROLL): task variants and deliberate breakage, chosen by seed and recorded.

Everything here is a pure function of (seed, catalogue) that turns a ``SandboxSpec`` into another;
no file on the host changes. Removing a tool masks it with /dev/null (running it fails with
"Permission denied"); renaming binds the real binary at ``/opt/rollyard/bin/NEW`` and masks the old
path; a dead mirror points the package managers' index settings at an unroutable address. The
returned ``PerturbationRecord`` is what the trajectory stores, so a run can be replayed exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import InvalidRequest
from rollyard.sandbox.base import SandboxSpec

RENAME_DIR = "/opt/rollyard/bin"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
DEAD_MIRROR = "http://10.255.255.1/simple"


class Variant(BaseModel):
    """One declared flavour of a task's environment (package set, mirror config, env vars)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    env: dict[str, str] = Field(default_factory=dict)
    ro_binds: list[tuple[Path, Path]] = Field(default_factory=list)  # e.g. a site-packages of v1.2


class Perturbation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["remove_tool", "rename_tool", "dead_mirror"]
    target: str = ""  # absolute path of the tool, for remove/rename
    new_name: str = ""  # for rename


class PerturbationRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int
    variant: str | None = None
    perturbations: list[Perturbation] = Field(default_factory=list)


def choose(
    seed: int, variants: Sequence[Variant] = (), catalogue: Sequence[Perturbation] = (), k: int = 1
) -> PerturbationRecord:
    """Pick one variant and ``k`` distinct perturbations, deterministically from ``seed``."""
    if k < 0 or k > len(catalogue):
        raise InvalidRequest(f"cannot pick {k} perturbations from a catalogue of {len(catalogue)}")
    rng = random.Random(seed)
    variant = rng.choice(list(variants)).name if variants else None
    picked = rng.sample(list(catalogue), k)
    return PerturbationRecord(seed=seed, variant=variant, perturbations=picked)


def _check(p: Perturbation) -> None:
    if p.kind in ("remove_tool", "rename_tool"):
        if not p.target.startswith("/") or ".." in p.target.split("/"):
            raise InvalidRequest(f"{p.kind}: target must be an absolute path, got {p.target!r}")
        if not Path(p.target).exists():
            raise InvalidRequest(f"{p.kind}: {p.target} does not exist on this host")
    if p.kind == "rename_tool" and (not p.new_name or "/" in p.new_name or p.new_name in (".", "..")):
        raise InvalidRequest(f"rename_tool: invalid new name {p.new_name!r}")


def apply(spec: SandboxSpec, record: PerturbationRecord, variants: Sequence[Variant] = ()) -> SandboxSpec:
    """The spec with the record's variant and perturbations applied (the input is not changed)."""
    env = dict(spec.env)
    ro = list(spec.ro_binds)
    if record.variant is not None:
        by_name = {v.name: v for v in variants}
        if record.variant not in by_name:
            raise InvalidRequest(f"unknown variant {record.variant!r}")
        env.update(by_name[record.variant].env)
        ro += by_name[record.variant].ro_binds
    renamed = False
    for p in record.perturbations:
        _check(p)
        if p.kind == "remove_tool":
            ro.append((Path("/dev/null"), Path(p.target)))
        elif p.kind == "rename_tool":
            ro.append((Path(p.target).resolve(), Path(RENAME_DIR) / p.new_name))
            ro.append((Path("/dev/null"), Path(p.target)))
            renamed = True
        else:
            host = DEAD_MIRROR.split("/")[2]
            env.update(
                PIP_INDEX_URL=DEAD_MIRROR,
                PIP_TRUSTED_HOST=host,
                PIP_DEFAULT_TIMEOUT="3",
                UV_INDEX_URL=DEAD_MIRROR,
                npm_config_registry=f"http://{host}/",
            )
    if renamed:
        env["PATH"] = f"{RENAME_DIR}:{env.get('PATH', DEFAULT_PATH)}"
    return spec.model_copy(update={"env": env, "ro_binds": ro})
