"""The sweep file: reading and validating the TOML, and expanding it into planned runs.

The format is described in :mod:`fedtail.sweep` and docs/sweeps.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtail.config import RunConfig, flags_to_nested, load_toml, merge
from fedtail.components import build_config
from fedtail.errors import ConfigError

SWEEP_KEYS = ("out", "seeds", "jobs", "base", "settings", "methods")
DEFAULT_SETTING = "default"
ORDER = "settings (file order), then methods (file order), then seeds (list order)"
_NAME = re.compile(r"^[A-Za-z0-9_+=,@-][A-Za-z0-9_.+=,@-]*$")


@dataclass(frozen=True)
class PlannedRun:
    setting: str
    method: str
    seed: int
    dir: Path
    config: RunConfig

    @property
    def label(self) -> str:
        return f"{self.setting}/{self.method}/seed{self.seed}"

    def config_dict(self) -> dict[str, Any]:
        """The config as ``config.json`` will hold it."""
        return json.loads(json.dumps(self.config.model_dump(mode="json")))


@dataclass
class Sweep:
    file: Path
    out: Path
    seeds: list[int]
    jobs: int
    settings: list[str]
    methods: list[str]
    runs: list[PlannedRun]  # every run of the file, in execution order
    selected: list[PlannedRun] = field(default_factory=list)  # after --settings / --methods

    def selected_dirs(self) -> set[Path]:
        return {r.dir for r in self.selected}


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table (got {value!r})")
    return value


def _names(tables: dict[str, Any], where: str) -> None:
    for name in tables:
        if not _NAME.match(name):
            raise ConfigError(
                f"{where}.{name!r}: names become folder names; use letters, digits and . _ - + = , @ "
                "(not starting with '.')"
            )


def _pick(requested: list[str] | None, known: list[str], flag: str) -> list[str]:
    if not requested:
        return known
    unknown = [n for n in requested if n not in known]
    if unknown:
        raise ConfigError(f"{flag} {','.join(unknown)}: not in the sweep file; choose from: {', '.join(known)}")
    return [n for n in known if n in requested]


def _seed_list(value: Any, where: str) -> list[int]:
    if (
        not isinstance(value, list)
        or not value
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in value)
    ):
        raise ConfigError(f"{where} must be a non-empty list of integers >= 0 (got {value!r})")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where} has duplicates ({value})")
    return list(value)


def load_sweep(
    path: str | Path,
    *,
    out: str | Path | None = None,
    settings: list[str] | None = None,
    methods: list[str] | None = None,
    seeds: list[int] | None = None,
) -> Sweep:
    """Parse a sweep file and build (validate) the RunConfig of every run; raises ConfigError."""
    path = Path(path)
    raw = load_toml(path, "sweep")
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SWEEP_KEYS)}")

    out_value = out if out is not None else raw.get("out")
    if not out_value or not isinstance(out_value, (str, Path)):
        raise ConfigError(f"sweep {path}: `out` (the folder of the runs) must be a non-empty string")
    file_seeds = _seed_list(raw.get("seeds"), f"sweep {path}: `seeds`")
    jobs = raw.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"sweep {path}: `jobs` must be an integer >= 1 (got {jobs!r})")

    base = flags_to_nested(_table(raw.get("base", {}), f"sweep {path}: [base]"))
    setting_tables = _table(raw.get("settings", {DEFAULT_SETTING: {}}), f"sweep {path}: [settings]")
    method_tables = _table(raw.get("methods", {}), f"sweep {path}: [methods]")
    if not setting_tables:
        setting_tables = {DEFAULT_SETTING: {}}
    if not method_tables:
        raise ConfigError(f"sweep {path}: no [methods.NAME] table; add at least one, e.g. [methods.fedavg]")
    _names(setting_tables, f"sweep {path}: settings")
    _names(method_tables, f"sweep {path}: methods")

    for key in ("seed", "algorithm"):
        if key in base:
            owner = "the top-level `seeds` list" if key == "seed" else "[methods.NAME] (default: NAME)"
            raise ConfigError(f"sweep {path}: [base] {key}: set it in {owner}")
    settings_norm: dict[str, dict[str, Any]] = {}
    for name, table in setting_tables.items():
        table = flags_to_nested(_table(table, f"sweep {path}: [settings.{name}]"))
        for key in ("seed", "algorithm"):
            if key in table:
                raise ConfigError(f"sweep {path}: [settings.{name}] {key}: not allowed in a setting")
        settings_norm[name] = table
    methods_norm: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}
    method_seeds: dict[str, list[int]] = {}
    for name, table in method_tables.items():
        table = dict(_table(table, f"sweep {path}: [methods.{name}]"))
        algorithm = table.pop("algorithm", name)
        if not isinstance(algorithm, str):
            raise ConfigError(f"sweep {path}: [methods.{name}] algorithm must be a string (got {algorithm!r})")
        options = _table(table.pop("options", {}), f"sweep {path}: [methods.{name}] options")
        # a method's own seeds (e.g. more seeds for the strongest methods) replace the file's
        own = table.pop("seeds", None)
        method_seeds[name] = file_seeds if own is None else _seed_list(own, f"sweep {path}: [methods.{name}] seeds")
        rest = flags_to_nested(table)
        if "seed" in rest:
            raise ConfigError(f"sweep {path}: [methods.{name}] seed: set it in `seeds` (top level or the method's)")
        methods_norm[name] = (algorithm, options, rest)

    out_dir = Path(out_value)
    runs: list[PlannedRun] = []
    for s_name, s_table in settings_norm.items():
        for m_name, (algorithm, options, rest) in methods_norm.items():
            config_raw = merge(merge(merge(base, s_table), rest), {"algorithm": algorithm, "options": options})
            for seed in method_seeds[m_name]:
                try:
                    config = build_config(config_raw | {"seed": seed})
                except ConfigError as err:
                    raise ConfigError(f"sweep {path}: setting {s_name!r}, method {m_name!r}: {err}") from None
                runs.append(PlannedRun(s_name, m_name, seed, out_dir / s_name / m_name / f"seed{seed}", config))

    pick_s = _pick(settings, list(settings_norm), "--settings")
    pick_m = _pick(methods, list(methods_norm), "--methods")
    all_seeds = sorted({k for ks in method_seeds.values() for k in ks})
    if seeds:
        unknown = sorted(set(seeds) - set(all_seeds))
        if unknown:
            raise ConfigError(
                f"--seeds {','.join(map(str, unknown))}: not in the sweep file; choose from: {', '.join(map(str, all_seeds))}"
            )
    selected = [r for r in runs if r.setting in pick_s and r.method in pick_m and (not seeds or r.seed in seeds)]
    order = file_seeds + [k for k in all_seeds if k not in file_seeds]
    return Sweep(path, out_dir, order, jobs, list(settings_norm), list(methods_norm), runs, selected)
