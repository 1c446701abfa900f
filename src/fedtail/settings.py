"""A run setting is declared once, on its config field: ``Field(..., json_schema_extra=setting(...))``.

The field gives the name, the type, the default and the validation; :func:`setting` adds what the
tools around the config need, and everything else derives from it:

- the command-line flag (``--clients`` for ``partition.num_clients``) with its help text and its
  help panel, on the commands that show it (``run``, ``compare`` and Flower's commands share
  ``run``'s; ``partition``). See :func:`fedtail.cli.options.setting_options`.
- the flag map ``fedtail.config.FLAG_KEYS`` (flag name → path in the config), which ``fedtail.run``
  keywords and sweep files use too;
- ``omit_default``: left out of ``config.json`` while at its default, so the files of runs made
  before the setting existed stay as they were;
- ``sweep_ignores``: a sweep (and resuming) compares configs without it, since it does not
  change results (``fedtail.report.runfiles.IGNORED_KEYS``).

:func:`settings` lists them, walking nested config models (``partition``, ``train``, ``faults``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PANELS = ("Algorithm, data and model", "Partition", "Rounds and evaluation", "Local training",
          "Faults", "Privacy", "Reproducibility and compute", "Logging")  # fmt: skip


def setting(
    help: str | None = None,
    *,
    flag: str | None = None,
    panel: str | None = None,
    short: str | None = None,
    commands: tuple[str, ...] = ("run",),
    omit_default: bool = False,
    sweep_ignores: bool = False,
) -> dict[str, Any]:
    """The ``json_schema_extra`` of a run setting's field (module docstring). ``help`` None: no flag
    (the setting is set in files or with ``--set``); ``flag``: the flag's name when it is not the
    field's (``clients`` for ``num_clients``)."""
    if panel is not None and panel not in PANELS:
        raise ValueError(f"unknown panel {panel!r}")
    return {"setting": {"help": help, "flag": flag, "panel": panel, "short": short, "commands": list(commands),
                        "omit_default": omit_default, "sweep_ignores": sweep_ignores}}  # fmt: skip


@dataclass(frozen=True)
class Setting:
    """One run setting, as its field declares it."""

    path: tuple[str, ...]  # where it lives in the config: ("partition", "num_clients")
    name: str | None  # the flag's name (``clients``; the flag is ``--clients``), None without a flag
    annotation: Any
    default: Any
    help: str | None
    panel: str | None
    short: str | None
    commands: tuple[str, ...]
    omit_default: bool
    sweep_ignores: bool

    @property
    def flag(self) -> str | None:
        return None if self.name is None else "--" + self.name.replace("_", "-")


def settings(model: Any, prefix: tuple[str, ...] = ()) -> list[Setting]:
    """Every declared setting of a config model and of the config models nested in it, in field order."""
    from pydantic import BaseModel

    found: list[Setting] = []
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        meta = extra.get("setting")
        path = (*prefix, name)
        if meta is not None:
            default = field.default_factory() if field.default_factory is not None else field.default
            found.append(Setting(
                path, (meta["flag"] or name) if meta["help"] is not None else None, field.annotation, default,
                meta["help"], meta["panel"], meta["short"], tuple(meta["commands"]), meta["omit_default"],
                meta["sweep_ignores"],
            ))  # fmt: skip
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += settings(annotation, path)
    return found


def flag_keys(model: Any) -> dict[str, tuple[str, ...]]:
    """Flag name → the setting's path in the config, for every setting with a flag."""
    return {s.name: s.path for s in settings(model) if s.name is not None}
