"""A run folder: ``config.json``, ``metrics.jsonl`` (one line per evaluation), ``summary.json``.

``summary.json`` is written last and atomically: a folder without it is not a finished run
(a crashed run leaves ``FAILED`` with the error instead).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON without NaN/Infinity (strict parsers reject them): non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2) + "\n")
    os.replace(tmp, path)


def is_finished(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


class RunWriter:
    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)

    def start(self, config: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "metrics.jsonl", "FAILED"):
            (self.dir / stale).unlink(missing_ok=True)
        write_json(self.dir / "config.json", config)
        for name, data in (extra or {}).items():
            write_json(self.dir / name, data)

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(_clean(row)) + "\n")

    def finish(self, summary: dict[str, Any]) -> None:
        write_json(self.dir / "summary.json", summary)

    def fail(self, error: BaseException) -> None:
        (self.dir / "FAILED").write_text(f"{type(error).__name__}: {error}\n")
