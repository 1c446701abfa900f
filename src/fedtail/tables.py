"""Runs as pandas DataFrames: every run folder under a root as one row, a run's evaluations as rows.

    import fedtail
    runs = fedtail.load_runs("benchmarks/fedac/runs/table1")       # one row per run folder
    runs.groupby(["config.algorithm", "setting"])["final.personalized_acc"].agg(["mean", "std"])
    fedtail.load_run("runs/mine").frame()                             # one row per evaluation

A run's row: ``path`` (the folder, relative to the root), ``setting`` and ``method`` (the sweep's
names: the folder's parents, ``SETTING/METHOD/seedN``, where the layout is a sweep's), the
config flattened to dotted keys (``config.partition.alpha``, ``config.options.mu``, ...), the
summary's numbers (``status``, ``rounds``, ``wall_time_s``, ``samples_per_s``), ``final.*``,
``best.*`` and ``last10.*`` (each of its metrics), ``time_s.*`` and ``bytes.*``, and ``code.commit``
/ ``code.modified``. A folder that is not a finished run (no ``summary.json``) is left out; one
whose files do not read is left out with a warning naming it. ``fedtail runs ROOT --csv FILE``
writes the same table. pandas is an optional dependency (``pip install pandas``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtail.errors import ConfigError, FedtailError

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from fedtail.api import RunResult

SEED_DIR = re.compile(r"seed(\d+)$")


def pandas_module():
    """pandas, or a clear error naming the install."""
    try:
        import pandas
    except ImportError:
        raise ConfigError("fedtail's tables need pandas: pip install pandas (or pip install 'fedtail[pandas]')") from None
    return pandas


def flatten(value: Any, prefix: str, into: dict[str, Any]) -> dict[str, Any]:
    """``value``'s scalars under dotted keys (lists kept as they are, of scalars: a cell each)."""
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{prefix}.{key}" if prefix else str(key), into)
    else:
        into[prefix] = value
    return into


def run_row(result: "RunResult", root: Path | None = None) -> dict[str, Any]:
    """The one-row view of a run (module docstring)."""
    row: dict[str, Any] = {}
    path = result.dir
    if path is not None:
        rel = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
        row["path"] = str(rel)
        parts = rel.parts
        if parts and SEED_DIR.match(parts[-1]):  # a sweep's SETTING/METHOD/seedN
            row["method"] = parts[-2] if len(parts) >= 2 else None
            row["setting"] = parts[-3] if len(parts) >= 3 else None
    summary = result.summary
    for key in ("status", "rounds", "wall_time_s", "samples_trained", "samples_per_s"):
        if key in summary:
            row[key] = summary[key]
    flatten(result.config.model_dump(mode="json"), "config", row)
    for part in ("final", "best", "last10", "time_s", "bytes", "code"):
        if isinstance(summary.get(part), dict):
            flatten(summary[part], part, row)
    return {k: v for k, v in row.items() if not isinstance(v, (list, dict))}


def load_runs(root: str | Path) -> "pandas.DataFrame":
    """Every finished run folder under ``root`` (searched recursively) as one row (module docstring)."""
    from fedtail.api import load_run

    pd = pandas_module()
    root = Path(root)
    if not root.is_dir():
        raise FedtailError(f"{root}: no such folder")
    rows = []
    for summary in sorted(root.rglob("summary.json")):
        try:
            rows.append(run_row(load_run(summary.parent), root))
        except (FedtailError, ValueError) as err:
            warnings.warn(f"{summary.parent}: left out ({err})", stacklevel=2)
    frame = pd.DataFrame(rows)
    first = [c for c in ("path", "setting", "method", "config.algorithm", "config.seed", "status") if c in frame]
    return frame[first + [c for c in frame.columns if c not in first]]


def evaluations(result: "RunResult") -> "pandas.DataFrame":
    """A run's evaluations, one row each (``metrics.jsonl``'s scalars, nested ones dotted:
    ``named.gp.personalized_acc``; the per-round logs and per-client arrays left out)."""
    pd = pandas_module()
    rows = []
    for raw in result.rows:
        row = flatten({k: v for k, v in raw.items() if k != "rounds_log"}, "", {})
        rows.append({k: v for k, v in row.items() if not isinstance(v, (list, dict))})
    return pd.DataFrame(rows)
