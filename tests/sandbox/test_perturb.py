"""Variants and seeded perturbations: deterministic, recorded, and effective inside a sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.core.errors import InvalidRequest
from rollyard.sandbox import SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider
from rollyard.sandbox.perturb import Perturbation, PerturbationRecord, Variant, apply, choose

VARIANTS = [Variant(name=f"v{i}", env={"PKG_VERSION": f"1.{i}"}) for i in range(4)]
CATALOGUE = [
    Perturbation(kind="remove_tool", target="/usr/bin/tac"),
    Perturbation(kind="rename_tool", target="/usr/bin/sed", new_name="sed2"),
    Perturbation(kind="dead_mirror"),
]


def test_the_same_seed_picks_the_same_variant_and_perturbations_and_seeds_differ() -> None:
    a = choose(7, VARIANTS, CATALOGUE, k=2)
    assert a == choose(7, VARIANTS, CATALOGUE, k=2)
    assert PerturbationRecord.model_validate(a.model_dump(mode="json")) == a  # storable as data
    picks = {
        (r.variant, tuple(p.kind for p in r.perturbations))
        for r in map(choose, range(30), [VARIANTS] * 30, [CATALOGUE] * 30)
    }
    assert len(picks) > 3


def test_apply_leaves_the_input_spec_untouched_and_rejects_bad_entries() -> None:
    spec = SandboxSpec(env={"A": "1"})
    rec = PerturbationRecord(seed=0, variant="v1", perturbations=[CATALOGUE[2]])
    out = apply(spec, rec, VARIANTS)
    assert spec.env == {"A": "1"}
    assert out.env["PKG_VERSION"] == "1.1" and out.env["PIP_INDEX_URL"].startswith("http://10.")
    with pytest.raises(InvalidRequest, match="unknown variant"):
        apply(spec, PerturbationRecord(seed=0, variant="zzz"), VARIANTS)
    with pytest.raises(InvalidRequest, match="absolute"):
        apply(
            spec, PerturbationRecord(seed=0, perturbations=[Perturbation(kind="remove_tool", target="git")])
        )
    with pytest.raises(InvalidRequest, match="new name"):
        bad = Perturbation(kind="rename_tool", target="/usr/bin/sed", new_name="../x")
        apply(spec, PerturbationRecord(seed=0, perturbations=[bad]))
    with pytest.raises(InvalidRequest):
        choose(0, VARIANTS, CATALOGUE, k=9)


async def test_perturbations_take_effect_inside_the_sandbox_only(provider: BwrapProvider) -> None:
    rec = PerturbationRecord(seed=1, variant="v2", perturbations=CATALOGUE)
    broken = await provider.create(apply(SandboxSpec(), rec, VARIANTS))
    plain = await provider.create(SandboxSpec())
    try:
        r = await broken.exec(
            "echo $PKG_VERSION; echo ab | sed2 s/a/x/; echo $PIP_INDEX_URL; echo x | sed s/x/y/"
        )
        lines = r.stdout.split()
        assert lines[:2] == ["1.2", "xb"] and lines[2].startswith("http://10.255")
        assert "y" not in lines and "sed" in r.stderr
        assert (await broken.exec("echo a | tac")).rc != 0
        assert (await plain.exec("echo a | tac; echo q | sed s/q/z/")).stdout == "a\nz\n"
        assert Path("/usr/bin/tac").stat().st_size > 0  # the host is untouched
    finally:
        await broken.close()
        await plain.close()
