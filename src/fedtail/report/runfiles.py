"""A run folder: ``config.json``, ``metrics.jsonl`` (one line per evaluation), ``summary.json``.

``summary.json`` is written last and atomically: a folder without it is not a finished run
(a crashed run leaves ``FAILED`` with the error instead). While a run goes on with
``checkpoint_every`` > 0 the folder also holds ``checkpoint.pt`` (the state after a round, see
:mod:`fedtail.engine.checkpoint`) and ``checkpoint.json`` (its round and config, for the
sweep); both are deleted when the run finishes.

A finished run's large records may be stored compressed (:func:`compress_records`:
``metrics.jsonl.gz`` and ``partition.json.gz``, gzip -9, in place of the plain files; the committed
benchmark runs are, to keep a checkout light). Everything that reads a record reads either
(:func:`read_record`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

from fedtail.config import RunConfig
from fedtail.settings import settings

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_INFO = "checkpoint.json"
# The settings that do not change results (declared sweep_ignores on their fields): a sweep and a
# resume compare configs without them.
IGNORED_KEYS = tuple(s.path[0] for s in settings(RunConfig) if s.sweep_ignores and len(s.path) == 1)


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


def metrics_line(row: dict[str, Any]) -> str:
    return json.dumps(_clean(row)) + "\n"


def is_finished(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


COMPRESSED = ("metrics.jsonl", "partition.json")  # the records a finished run may hold as NAME.gz


def read_record(run_dir: str | Path, name: str) -> str | None:
    """The text of ``name`` in ``run_dir``, or of its compressed ``name.gz``; None if neither is there."""
    plain = Path(run_dir) / name
    try:
        return plain.read_text()
    except FileNotFoundError:
        pass
    try:
        return gzip.decompress(plain.with_name(name + ".gz").read_bytes()).decode()
    except FileNotFoundError:
        return None


def has_record(run_dir: str | Path, name: str) -> bool:
    plain = Path(run_dir) / name
    return plain.is_file() or plain.with_name(name + ".gz").is_file()


def compress_records(run_dir: str | Path) -> list[Path]:
    """Replace a finished run's ``metrics.jsonl`` and ``partition.json`` by gzip -9 copies (no
    timestamp in the header, so the bytes depend on the content alone); the compressed files.
    An unfinished run is left alone: its metrics still grow, and a resume rewrites them. Two
    processes may compress one folder at once (sweeps sharing ``out``): they write the same bytes."""
    run_dir = Path(run_dir)
    if not is_finished(run_dir) or (run_dir / CHECKPOINT).exists():
        return []
    done = []
    for name in COMPRESSED:
        plain = run_dir / name
        try:
            data = plain.read_bytes()
        except FileNotFoundError:  # none, or another process compressed it meanwhile
            continue
        packed = plain.with_name(name + ".gz")
        tmp = packed.with_name(f"{packed.name}.{os.getpid()}.tmp")
        tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        os.replace(tmp, packed)
        plain.unlink(missing_ok=True)
        done.append(packed)
    return done


def config_diff(old: Any, new: Any, ignore: tuple[str, ...] = IGNORED_KEYS, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, as ``key: old -> new`` (``ignore`` applies at top level).

    Two run configs are compared with their algorithm options completed by the defaults
    (:func:`fedtail.components.resolved_options`): an option left out equals its default."""
    if not prefix and isinstance(old, dict) and isinstance(new, dict) and "algorithm" in old and "algorithm" in new:
        from fedtail.components import resolved_options  # the registry is needed only here

        old, new = resolved_options(old), resolved_options(new)
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in list(old) + [k for k in new if k not in old]:
            if not prefix and key in ignore:
                continue
            name = f"{prefix}.{key}" if prefix else str(key)
            # an optional setting added later: null (its default) equals absent in older files
            if key not in old:
                if new[key] is not None:
                    out.append(f"{name}: (absent) -> {json.dumps(new[key])}")
            elif key not in new:
                if old[key] is not None:
                    out.append(f"{name}: {json.dumps(old[key])} -> (absent)")
            else:
                out.extend(config_diff(old[key], new[key], ignore, name))
        return out
    return [] if old == new else [f"{prefix}: {json.dumps(old)} -> {json.dumps(new)}"]


def checkpoint_info(run_dir: str | Path) -> dict[str, Any] | None:
    """``checkpoint.json`` of an unfinished run (round, rounds, config, ...), or None.

    None also when ``checkpoint.pt`` is missing or the file is unreadable.
    """
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).is_file():
        return None
    try:
        info = json.loads((run_dir / CHECKPOINT_INFO).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(info, dict) and isinstance(info.get("round"), int) and isinstance(info.get("config"), dict)
    return info if ok else None


class RunWriter:
    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)

    def start(self, config: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "metrics.jsonl", "FAILED", CHECKPOINT, CHECKPOINT_INFO,
                      *(name + ".gz" for name in COMPRESSED)):  # fmt: skip
            (self.dir / stale).unlink(missing_ok=True)
        write_json(self.dir / "config.json", config)
        for name, data in (extra or {}).items():
            write_json(self.dir / name, data)

    def resume(self, config: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        """Continue a checkpointed run: ``metrics.jsonl`` holds exactly the checkpoint's ``rows``.

        The rows recorded after the checkpoint (by the run that was stopped) are dropped; the
        file is rewritten from the checkpoint, so it is whole even if the stop cut a line.
        """
        (self.dir / "FAILED").unlink(missing_ok=True)
        write_json(self.dir / "config.json", config)  # may differ in IGNORED_KEYS (workers)
        path = self.dir / "metrics.jsonl"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(metrics_line(row) for row in rows))
        os.replace(tmp, path)

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.dir / "metrics.jsonl", "a") as fh:
            fh.write(metrics_line(row))

    def finish(self, summary: dict[str, Any]) -> None:
        write_json(self.dir / "summary.json", summary)
        self.drop_checkpoint()

    def drop_checkpoint(self) -> None:
        for name in (CHECKPOINT, CHECKPOINT_INFO, CHECKPOINT + ".tmp"):
            (self.dir / name).unlink(missing_ok=True)

    def fail(self, error: BaseException) -> None:
        (self.dir / "FAILED").write_text(f"{type(error).__name__}: {error}\n")
