"""Third-party agent CLIs, installed once into rollyard's cache and bound read-only into sandboxes.

``rollyard agents install NAME`` fetches a pinned release from its registry (PyPI through pip,
npm through npm) into ``<cache>/agents/NAME-VERSION`` and nothing is downloaded at run time: a
run whose runner profile names a CLI that is not installed fails at start with the command that
installs it. Installs are atomic (built in a temporary directory, then renamed), so an
interrupted install leaves nothing that looks installed.

A PyPI CLI is installed with ``--target`` and ``--no-deps`` after pip's own resolver (a dry run
against this environment) said which distributions this environment lacks: the agent then runs
on the sandbox's ``python3`` with its directory first on ``PYTHONPATH`` and this environment's
packages (litellm, openai, ...) after it. An npm CLI is installed with ``npm install --prefix``
and runs under the host's Node.js (Debian's ``nodejs`` package where it is missing).

Besides the pinned CLIs, a runner profile may bring its own: ``install: {pypi: "pkg==1.2"}``
(or a local package directory or wheel), ``{npm: "pkg@1.2"}`` (or a local tarball), or
``{path: /opt/mycli}`` (an existing directory, bound read-only; nothing is installed). Such a CLI
is cached under the profile's name and a digest of its spec, so changing the spec reinstalls it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from rollyard.core.atomic import replace_dir
from rollyard.core.cache import cache_dir
from rollyard.core.errors import ConfigError
from rollyard.sandbox.host_python import searchable

__all__ = [
    "CLIS",
    "AgentCLI",
    "InstallSpec",
    "cli_for",
    "install",
    "installed",
    "require",
    "require_reachable_cache",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentCLI:
    name: str
    source: Literal["pypi", "npm", "path"]
    package: str  # what pip or npm installs (a pinned name, a local path), or the directory
    version: str  # the pin, or a digest of a profile's own spec
    api: str  # the API it speaks through the gateway (for docs and `agents list`)

    @property
    def dir(self) -> Path:
        if self.source == "path":
            return Path(self.package)
        return cache_dir() / "agents" / f"{self.name}-{self.version}"

    @property
    def site(self) -> Path:
        """Where its code lives: the ``--target`` directory (PyPI), the npm prefix, or the path."""
        if self.source == "path":
            return self.dir
        return self.dir / ("site" if self.source == "pypi" else "npm")

    @property
    def bin_dirs(self) -> list[Path]:
        """Directories the sandbox's ``PATH`` gets first (npm's ``.bin``, a path CLI's ``bin``)."""
        if self.source == "npm":
            return [self.site / "node_modules" / ".bin"]
        if self.source == "path":
            return [d for d in (self.dir / "bin", self.dir) if d.is_dir()][:1]
        return [self.site / "bin"]  # console scripts pip wrote with --target


CLIS: dict[str, AgentCLI] = {
    c.name: c
    for c in (
        AgentCLI("mini-swe-agent", "pypi", "mini-swe-agent", "2.4.6", "OpenAI chat completions (litellm)"),
        AgentCLI("claude-code", "npm", "@anthropic-ai/claude-code", "2.1.332", "Anthropic messages"),
        AgentCLI("codex", "npm", "@openai/codex", "0.171.0", "OpenAI responses"),
    )
}


class InstallSpec(BaseModel):
    """A profile's own CLI: exactly one of a PyPI requirement, an npm package or a directory."""

    model_config = ConfigDict(extra="forbid")

    pypi: str | None = None  # "pkg==1.2", or an absolute path to a package directory or wheel
    npm: str | None = None  # "pkg@1.2", or an absolute path to a package tarball or directory
    path: Path | None = None  # an existing directory, bound read-only (its bin/ goes on PATH)

    @model_validator(mode="after")
    def _one(self) -> InstallSpec:
        given = [k for k in ("pypi", "npm", "path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"install needs exactly one of pypi, npm or path (got {given or 'none'})")
        if self.path is not None and not self.path.is_absolute():
            raise ValueError(f"install.path must be absolute, not {str(self.path)!r}")
        for key, pin in (("pypi", "=="), ("npm", "@")):
            value = getattr(self, key)
            if value is not None and not (value.startswith("/") or pin in value.lstrip("@")):
                raise ValueError(f"install.{key}: pin a version ({value!r} has no {pin!r}) or give a path")
        return self


def cli_for(install: str | InstallSpec | None, profile: str) -> AgentCLI | None:
    """The CLI a profile's ``install`` names: a pinned one by name, or the profile's own spec."""
    if install is None:
        return None
    if isinstance(install, str):
        return _cli(install)
    if install.path is not None:
        return AgentCLI(profile, "path", str(install.path), "path", f"{profile} (a directory)")
    source: Literal["pypi", "npm"] = "pypi" if install.pypi is not None else "npm"
    package = str(install.pypi if install.pypi is not None else install.npm)
    digest = hashlib.sha256(f"{source}:{package}".encode()).hexdigest()[:12]
    return AgentCLI(profile, source, package, digest, f"{profile} (its profile's own {source} package)")


def _cli(name: str | AgentCLI) -> AgentCLI:
    if isinstance(name, AgentCLI):
        return name
    if name not in CLIS:
        raise ConfigError(f"unknown agent CLI {name!r}; choose one of: {', '.join(sorted(CLIS))}")
    return CLIS[name]


def installed(name: str | AgentCLI) -> bool:
    cli = _cli(name)
    if cli.source == "path":
        return cli.dir.is_dir()
    return (cli.dir / "installed.json").is_file()


def require(name: str | AgentCLI) -> AgentCLI:
    """The CLI, installed; else a clear error naming the command that installs it."""
    cli = _cli(name)
    if cli.source == "path" and not cli.dir.is_dir():
        raise ConfigError(f"agent CLI {cli.name}: its install.path {cli.dir} is not a directory")
    if not installed(cli):
        raise ConfigError(
            f"agent CLI {cli.name} {cli.version} is not installed in {cli.dir.parent}; "
            f"run `rollyard agents install {cli.name}` (nothing is downloaded at run time)"
        )
    return cli


def require_reachable_cache() -> Path:
    """The cache dir, when a sandbox's unprivileged uid can reach it; else, before minutes of
    installing into it, a clear error naming the fix (root's default ``~/.cache`` is under a
    private ``/root``: the runner would refuse the CLI only once the run had started)."""
    root = cache_dir()
    reach = next(p for p in [root, *root.parents] if p.exists())  # what exists of it decides
    if not searchable(reach):
        raise ConfigError(
            f"the agent cache {root} is not reachable by the sandbox's user ({reach} or a parent "
            "is private); run `export ROLLYARD_CACHE=/var/cache/rollyard` (or any directory every "
            "user can traverse) and rerun"
        )
    return root


def _run(cmd: list[str], what: str, timeout_s: float = 1800) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise ConfigError(f"{what}: {cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: timed out after {timeout_s:.0f}s") from None
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:])
        raise ConfigError(f"{what} failed (rc={res.returncode}; offline without a cache?):\n{tail}")
    return res.stdout


def _pinned(cli: AgentCLI, pin: str) -> str:
    """What pip or npm is given: a local path or an already pinned spec as it is, else name+pin."""
    given = cli.package
    if given.startswith("/") or pin in given.lstrip("@"):
        return given
    return f"{given}{pin}{cli.version}"


def _pip_missing(spec: str, work: Path) -> list[str]:
    """What pip would add to this environment for ``spec``: ``name==version`` for an index
    distribution, the local path for one given as a directory or wheel."""
    report = work / "report.json"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--dry-run", "--report", str(report), spec], f"resolving {spec}")
    found = json.loads(report.read_text())["install"]
    out = []
    for i in found:
        url = str(i.get("download_info", {}).get("url", ""))
        if i.get("is_direct") and url.startswith("file://"):  # the profile's own local package
            out.append(url.removeprefix("file://"))
        else:
            out.append(f"{i['metadata']['name']}=={i['metadata']['version']}")
    return out


def _install_pypi(cli: AgentCLI, dest: Path) -> list[str]:
    spec = _pinned(cli, "==")
    wanted = _pip_missing(spec, dest)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", "--target", str(dest / "site"), *wanted], f"installing {spec}")
    _portable_scripts(dest / "site" / "bin")
    return wanted


def _portable_scripts(bin_dir: Path) -> None:
    """Console scripts pip wrote name this process's interpreter, which a sandbox may not see
    (another venv path); they run on the sandbox's ``python3``, as the CLI's package does."""
    if not bin_dir.is_dir():
        return
    for script in bin_dir.iterdir():
        if not script.is_file():
            continue
        data = script.read_bytes()
        first, nl, rest = data.partition(b"\n")
        if first.startswith(b"#!") and b"python" in first:
            script.write_bytes(b"#!/usr/bin/env python3" + nl + rest)


def _install_npm(cli: AgentCLI, dest: Path) -> list[str]:
    spec = _pinned(cli, "@")
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError(f"installing {spec} needs Node.js and npm (Debian: apt-get install nodejs npm)")
    prefix = dest / "npm"
    prefix.mkdir()
    _run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--omit=dev", spec], spec)
    return [spec]


def install(name: str | AgentCLI, *, force: bool = False) -> AgentCLI:
    """Install ``name`` into the cache (a no-op when it is there, unless ``force``)."""
    cli = _cli(name)
    if cli.source == "path":  # nothing to install: the directory is bound as it is
        return require(cli)
    if installed(cli) and not force:
        return cli

    def fill(tmp: Path) -> None:
        wanted = (_install_pypi if cli.source == "pypi" else _install_npm)(cli, tmp)
        meta = {"name": cli.name, "package": cli.package, "version": cli.version, "installed": wanted}
        (tmp / "installed.json").write_text(json.dumps(meta, indent=1))

    replace_dir(cli.dir, fill)
    # readable by the sandbox's unprivileged user, whatever this process's umask
    for root, dirs, files in os.walk(cli.dir):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    os.chmod(cli.dir, 0o755)
    log.info("agent CLI installed name=%s version=%s dir=%s", cli.name, cli.version, cli.dir)
    return cli
