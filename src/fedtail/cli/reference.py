"""``docs/cli.md``: every command and flag of the command line, generated from the Typer app.

    python -m fedtail.cli.reference > docs/cli.md     # (make cli-doc)

``tests/test_cli.py`` fails when the committed file differs from what this prints.
"""

from __future__ import annotations

import sys

import click
import typer.main


def config_default(name: str | None) -> object:
    """The run setting's default behind a flag (None: not a run setting, or no default)."""
    from fedtail.config import RunConfig
    from fedtail.settings import settings

    return next((s.default for s in settings(RunConfig) if s.name == name and name), None)


def _default(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag and param.default is not None:
        return "on" if param.default else "off"
    value = param.default
    if value is None:
        value = config_default(param.name)
        if isinstance(value, bool):
            return "on" if value else "off"
    if value is None or value == () or value == []:
        return ""
    if callable(value):
        return ""
    return f"`{value}`"


def _names(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        return f"`{param.human_readable_name}`"
    names = [*param.opts, *param.secondary_opts]
    return ", ".join(f"`{n}`" for n in names)


def _cell(text: str) -> str:
    return " ".join(text.replace("\\[", "[").split()).replace("|", "\\|")


def _section(name: str, command: click.Command, level: int) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    help_text = (command.help or "").strip()
    if help_text:
        lines += [help_text.replace("\b\n", "").replace("\\[", "["), ""]
    params = [p for p in command.params if p.name != "help"]
    if params:
        lines += ["| argument / flag | default | help |", "|---|---|---|"]
        for param in params:
            help_ = getattr(param, "help", None) or ""
            lines.append(f"| {_names(param)} | {_default(param)} | {_cell(help_)} |")
        lines.append("")
    if isinstance(command, click.Group):
        for sub in sorted(command.commands):
            lines += _section(f"{name} {sub}", command.commands[sub], level + 1)
    return lines


def reference() -> str:
    """The Markdown reference of ``fedtail`` and each of its commands."""
    from fedtail.cli.main import app

    root = typer.main.get_command(app)
    lines = [
        "# Command-line reference",
        "",
        "Generated from the command line itself (`python -m fedtail.cli.reference > docs/cli.md`, or",
        "`make cli-doc`); `tests/test_cli.py` fails when it is stale. `fedtail COMMAND --help` prints the",
        "same, grouped in panels.",
        "",
        (root.help or "").strip(),
        "",
    ]
    assert isinstance(root, click.Group)
    for name in sorted(root.commands):
        lines += _section(f"fedtail {name}", root.commands[name], 2)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(reference())
