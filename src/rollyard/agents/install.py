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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollyard.core.atomic import replace_dir
from rollyard.core.cache import cache_dir
from rollyard.core.errors import ConfigError

__all__ = ["CLIS", "AgentCLI", "install", "installed", "require"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentCLI:
    name: str
    source: Literal["pypi", "npm"]
    package: str
    version: str
    api: str  # the API it speaks through the gateway (for docs and `agents list`)

    @property
    def dir(self) -> Path:
        return cache_dir() / "agents" / f"{self.name}-{self.version}"

    @property
    def site(self) -> Path:
        """Where its code lives: the ``--target`` directory (PyPI) or the npm prefix."""
        return self.dir / ("site" if self.source == "pypi" else "npm")


CLIS: dict[str, AgentCLI] = {
    c.name: c
    for c in (
        AgentCLI("mini-swe-agent", "pypi", "mini-swe-agent", "2.4.6", "OpenAI chat completions (litellm)"),
        AgentCLI("claude-code", "npm", "@anthropic-ai/claude-code", "2.1.332", "Anthropic messages"),
        AgentCLI("codex", "npm", "@openai/codex", "0.171.0", "OpenAI responses"),
    )
}


def _cli(name: str) -> AgentCLI:
    if name not in CLIS:
        raise ConfigError(f"unknown agent CLI {name!r}; choose one of: {', '.join(sorted(CLIS))}")
    return CLIS[name]


def installed(name: str) -> bool:
    return (_cli(name).dir / "installed.json").is_file()


def require(name: str) -> AgentCLI:
    """The CLI, installed; else a clear error naming the command that installs it."""
    cli = _cli(name)
    if not installed(name):
        raise ConfigError(
            f"agent CLI {name} {cli.version} is not installed in {cli.dir.parent}; "
            f"run `rollyard agents install {name}` (nothing is downloaded at run time)"
        )
    return cli


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


def _pip_missing(spec: str, work: Path) -> list[str]:
    """The distributions (``name==version``) pip would add to this environment for ``spec``."""
    report = work / "report.json"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--dry-run", "--report", str(report), spec], f"resolving {spec}")
    found = json.loads(report.read_text())["install"]
    return [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in found]


def _install_pypi(cli: AgentCLI, dest: Path) -> list[str]:
    spec = f"{cli.package}=={cli.version}"
    wanted = _pip_missing(spec, dest)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", "--target", str(dest / "site"), *wanted], f"installing {spec}")
    return wanted


def _install_npm(cli: AgentCLI, dest: Path) -> list[str]:
    spec = f"{cli.package}@{cli.version}"
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError(f"installing {spec} needs Node.js and npm (Debian: apt-get install nodejs npm)")
    prefix = dest / "npm"
    prefix.mkdir()
    _run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--omit=dev", spec], spec)
    return [spec]


def install(name: str, *, force: bool = False) -> AgentCLI:
    """Install ``name`` into the cache (a no-op when it is there, unless ``force``)."""
    cli = _cli(name)
    if installed(name) and not force:
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
