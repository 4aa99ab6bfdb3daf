"""A profile's own CLI: install specs, where each kind lives, and how a sandbox sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.agents.blackbox import BlackBoxRunner, load_profile
from rollyard.agents.blackbox.profile import RunnerProfile
from rollyard.agents.install import CLIS, InstallSpec, cli_for, install, installed, require
from rollyard.core.errors import ConfigError
from rollyard.sandbox.base import Limits, SandboxSpec


def test_an_install_spec_names_exactly_one_pinned_source() -> None:
    for bad in ({}, {"pypi": "a==1", "npm": "b@1"}):
        with pytest.raises(ValueError, match="exactly one"):
            InstallSpec.model_validate(bad)
    with pytest.raises(ValueError, match="pin a version"):
        InstallSpec(pypi="some-agent")
    with pytest.raises(ValueError, match="pin a version"):
        InstallSpec(npm="@scope/agent")  # a scope's @ is not a version
    with pytest.raises(ValueError, match="absolute"):
        InstallSpec(path=Path("rel/dir"))
    assert InstallSpec(npm="@scope/agent@1.2").npm == "@scope/agent@1.2"
    assert InstallSpec(pypi="/abs/pkg").pypi == "/abs/pkg"


def test_a_profile_cli_is_cached_by_a_digest_of_its_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path))
    a = cli_for(InstallSpec(pypi="tool==1.0"), "mine")
    b = cli_for(InstallSpec(pypi="tool==1.1"), "mine")
    assert a is not None and b is not None
    assert a.dir.parent == tmp_path / "agents" and a.dir != b.dir and a.dir.name.startswith("mine-")
    assert cli_for("codex", "whatever") == CLIS["codex"]
    assert cli_for(None, "x") is None
    with pytest.raises(ConfigError, match=r"rollyard agents install mine"):
        require(a)


def test_a_path_cli_is_bound_as_it_is_and_its_bin_goes_first_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path / "cache"))
    tool = tmp_path / "tool"
    (tool / "bin").mkdir(parents=True)
    prof = RunnerProfile(
        name="t", command=["tool"], install=InstallSpec(path=tool), limits={"memory_mb": 4096}
    )
    cli = prof.cli
    assert cli is not None and cli.dir == tool and installed(cli) and install(cli) == cli
    assert not (tmp_path / "cache").exists()  # nothing was installed
    sock = tmp_path / "gw" / "gw.sock"
    spec = BlackBoxRunner(prof, sock, isolated=False).spec(SandboxSpec(limits=Limits(cpu_seconds=7)))
    assert spec.env["PATH"].split(":")[0] == str(tool / "bin")
    assert spec.limits.memory_mb == 4096 and spec.limits.cpu_seconds == 7  # the profile's over the run's
    gone = RunnerProfile(name="t", command=["tool"], install=InstallSpec(path=tmp_path / "nope"))
    with pytest.raises(ConfigError, match="is not a directory"):
        BlackBoxRunner(gone, sock, isolated=False).spec()


def test_a_profile_refuses_unknown_limits_and_unknown_pinned_clis(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\ncommand: [x]\nlimits: {memory: 4096}\n")
    with pytest.raises(ConfigError, match="memory"):
        load_profile(bad)
    bad.write_text("name: b\ncommand: [x]\ninstall: nope\n")
    with pytest.raises(ConfigError, match="unknown agent CLI 'nope'"):
        load_profile(bad)
