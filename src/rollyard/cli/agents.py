"""``rollyard agents install|list``: parse arguments, delegate to ``rollyard.agents.install``."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from rollyard.agents.blackbox import load_profile, shipped_profiles
from rollyard.agents.install import CLIS, install, installed
from rollyard.cli import app

agents_app = typer.Typer(help="Third-party agent CLIs and runner profiles.", no_args_is_help=True)
app.add_typer(agents_app, name="agents")


@agents_app.command("install")
def install_cmd(
    names: list[str] = typer.Argument(..., help=f"agent CLIs to install: {', '.join(CLIS)}"),
    force: bool = typer.Option(False, help="reinstall even when installed"),
) -> None:
    """Install pinned agent CLIs into rollyard's cache (ROLLYARD_CACHE), once; runs never download."""
    console = Console(stderr=True)
    for name in names:
        with console.status(f"installing {name} ..."):
            cli = install(name, force=force)
        print(f"{cli.name} {cli.version}: {cli.dir}")


@agents_app.command("list")
def list_cmd() -> None:
    """Shipped runner profiles, the CLI each one runs and whether it is installed."""
    table = Table("profile", "runs", "version", "API", "installed")
    for name in shipped_profiles():
        p = load_profile(name)
        cli = CLIS.get(p.install or "")
        if cli is None:
            table.add_row(name, p.command[0], "", p.description, "(shipped)")
        else:
            table.add_row(name, cli.package, cli.version, cli.api, "yes" if installed(cli.name) else "no")
    Console().print(table)
