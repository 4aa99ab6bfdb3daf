"""The ``rollyard`` command. Each sub-module parses one area's arguments and delegates;
``main`` turns rollyard's typed errors into one line on stderr and a non-zero exit."""

from __future__ import annotations

import logging
import os
import sys

import typer

from rollyard.core.errors import RollyardError

app = typer.Typer(
    name="rollyard",
    help="rollyard: agentic RL rollouts, gateway, rewards and trainer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # One line per area; each module adds its commands to ``app``.
    from rollyard.cli import agents, bench, engine, gateway, model, plan, run, sft, sim, tasks  # noqa: F401


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("ROLLYARD_LOG", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    _register()
    try:
        app()
    except RollyardError as e:
        print(f"rollyard: error: {e.message}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("rollyard: interrupted", file=sys.stderr)
        sys.exit(130)
