"""``rollyard agents install|list``: parse arguments, delegate to ``rollyard.agents.install``."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from rollyard.agents.blackbox import load_profile, shipped_profiles
from rollyard.agents.install import CLIS, AgentCLI, install, installed
from rollyard.cli import app
from rollyard.core.errors import ConfigError

agents_app = typer.Typer(help="Third-party agent CLIs and runner profiles.", no_args_is_help=True)
app.add_typer(agents_app, name="agents")


def _target(name: str) -> AgentCLI:
    """A pinned CLI by name, else the CLI of a runner profile (a shipped name or a YAML path)."""
    if name in CLIS:
        return CLIS[name]
    cli = load_profile(name).cli
    if cli is None:
        raise ConfigError(f"runner profile {name!r} installs nothing (its command is on the sandbox's PATH)")
    return cli


@agents_app.command("install")
def install_cmd(
    names: list[str] = typer.Argument(
        ..., help=f"pinned agent CLIs ({', '.join(CLIS)}) or runner profiles (a name or a YAML path)"
    ),
    force: bool = typer.Option(False, help="reinstall even when installed"),
) -> None:
    """Install agent CLIs into rollyard's cache (ROLLYARD_CACHE), once; runs never download."""
    console = Console(stderr=True)
    for name in names:
        target = _target(name)
        with console.status(f"installing {target.name} ..."):
            cli = install(target, force=force)
        print(f"{cli.name} {cli.version}: {cli.dir}")


@agents_app.command("list")
def list_cmd(
    profiles: list[str] = typer.Argument(None, help="profile YAML paths to list beside the shipped ones"),
) -> None:
    """Runner profiles (shipped, and any given), the CLI each one runs and whether it is installed."""
    table = Table("profile", "runs", "source", "version", "API", "installed")
    for name in [*shipped_profiles(), *(profiles or [])]:
        p = load_profile(name)
        cli = p.cli
        if cli is None:
            table.add_row(p.name, p.command[0], "(on PATH)", "", p.description, "")
        else:
            state = "yes" if installed(cli) else "no"
            table.add_row(p.name, cli.package, cli.source, cli.version, cli.api, state)
    Console().print(table)
