"""`mqd --help` opens with an overview of the commands; it must name every one the CLI has."""

from __future__ import annotations

import click

from mqd.operator.cli import main


def _commands(group: click.Group, prefix: str = "") -> list[str]:
    names = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            names += _commands(command, f"{prefix}{name} ")
        else:
            names.append(f"{prefix}{name}")
    return names


def test_the_help_overview_names_every_command() -> None:
    """Each command and subcommand appears in the overview's lines (an `offsets` group once did not)."""
    overview = (main.help or "").split("Exit codes")[0]
    entries = {
        entry.strip()
        for line in overview.splitlines()
        if ":" in line
        for entry in line.split(":", 1)[1].split(",")
    }
    missing = [name for name in _commands(main) if name not in entries]
    assert not missing, f"commands missing from mqd --help's overview: {missing}"
