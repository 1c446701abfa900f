"""Finding run folders and grouping them into (setting, method) cells for ``fedtail report``.

A run folder holds ``config.json`` and, once finished, ``summary.json``. Folders laid out as
``{setting}/{method}/seed{k}`` (what ``fedtail sweep`` writes; ``k`` must equal the config's
seed) are grouped by that layout; any other run is grouped by its config: the method is the
algorithm name (with its options, if any) and the setting a label derived from the dataset and
the partition (e.g. ``fmnist-a0.5-if10``). A ``sweep.json`` beside the setting folders gives
the order of settings and methods, the runs that were planned, and the sweep's command.

A finished run whose evaluations report named accuracies (``summary.json`` → ``named``: GLDP's
``gp``, ``lp``, ``head``) also stands, once per name, as the run of method ``METHOD:NAME`` with
that accuracy's numbers, so a table has a row per named accuracy (GLDP-GP and GLDP-LP from one run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedtail.errors import FedtailError
from fedtail.metrics.record import SUMMARY_KEYS, reductions
from fedtail.report.runfiles import read_record

_SEED_DIR = re.compile(r"seed(\d+)")


@dataclass
class Run:
    dir: Path  # as found (relative to the given folder's spelling)
    setting: str
    method: str
    seed: int | None
    config: dict[str, Any] | None
    summary: dict[str, Any] | None  # None: unfinished (or unreadable)
    sweep_root: Path | None = None
    problem: str = ""  # why an unfinished run is unfinished, or why a stale one is left out
    # finished, but with another config than the sweep file plans for its folder: not in the tables
    stale: bool = False
    diverged: int | None = None  # the round at which the run diverged (its summary says so); not finished
    named: str | None = None  # a named accuracy of another run (method "METHOD:NAME"), see with_named
    _metrics: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.summary is not None and not self.stale

    @property
    def eval_split(self) -> str:
        """The split the run was evaluated on (runs from before the option: test)."""
        return (self.config or {}).get("eval_split", "test")

    def metrics(self) -> list[dict[str, Any]]:
        """Rows of ``metrics.jsonl``, or of ``metrics.jsonl.gz`` where a large record was committed
        compressed (the repository keeps files under 1 MB); unreadable lines are skipped."""
        if self._metrics is None:
            rows: list[dict[str, Any]] = []
            try:
                text = read_record(self.dir, "metrics.jsonl") or ""
                for line in text.splitlines():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict):
                        rows.append(row)
            except OSError:
                pass
            self._metrics = rows
        return self._metrics

    def class_counts(self) -> np.ndarray | None:
        """Training samples per class of every client (clients × classes), from ``partition.json``;
        None where the folder has none."""
        try:
            clients = json.loads(read_record(self.dir, "partition.json") or "")["clients"]
            return np.array([c["train_counts"] for c in clients], dtype=np.int64)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def kept_classes(self) -> tuple[list[list[int]], list[int]] | None:
        """A semantic split's classes each client keeps and the training pixels per class, from
        ``partition.json``; None where the folder has none or the split keeps no classes."""
        try:
            part = json.loads(read_record(self.dir, "partition.json") or "")
            kept = [[int(c) for c in client["classes"]] for client in part["clients"]]
            return kept, [int(v) for v in part["global_train_pixel_counts"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def evaluations(self) -> list[dict[str, Any]]:
        """The rows of :meth:`metrics` with a round and a personalised accuracy (evaluated rounds)."""
        return [
            r for r in self.metrics()
            if isinstance(r.get("round"), int) and isinstance(r.get("personalized_acc"), (int, float))
        ]


NAMED_SEP = ":"  # the method of a named accuracy NAME of method METHOD: "METHOD:NAME"


def named_run(run: Run, name: str) -> Run:
    """The view of ``run`` (finished) as its named accuracy ``name``: summary.json's ``named[name]``
    entries in place of the headline ones, and each metrics row's ``named[name]`` values."""
    summary = run.summary or {}
    entries = summary["named"][name]
    view = replace(run, method=f"{run.method}{NAMED_SEP}{name}", named=name, _metrics=None)
    view.summary = {"status": "finished", "rounds": summary.get("rounds")} | entries
    rows = []
    for row in run.metrics():
        values = (row.get("named") or {}).get(name)
        if isinstance(values, dict):
            rows.append({k: row[k] for k in ("round", "global_round", "stage", "seen_stages") if k in row} | values)
    view._metrics = rows
    return view


def with_named(runs: list[Run], methods: list[str], expected: dict[tuple[str, str], set[int]]) -> list[str]:
    """Add to ``runs`` a run per named accuracy of each finished run (method ``METHOD:NAME``), to
    ``expected`` their cells' planned seeds; returns ``methods`` with each method's named ones
    right after it."""
    added: dict[str, list[str]] = {}
    for run in list(runs):
        if not run.finished or run.named is not None:
            continue
        for name in (run.summary or {}).get("named") or {}:
            view = named_run(run, name)
            runs.append(view)
            added.setdefault(run.method, [])
            if view.method not in added[run.method]:
                added[run.method].append(view.method)
            if (run.setting, run.method) in expected:
                expected.setdefault((run.setting, view.method), set()).update(expected[(run.setting, run.method)])
    out: list[str] = []
    for m in methods:
        out += [m, *added.get(m, [])]
    return out


@dataclass
class Collection:
    runs: list[Run]  # finished and unfinished, deduplicated
    settings: list[str]  # display order
    methods: list[str]
    expected: dict[tuple[str, str], set[int]]  # (setting, method) -> seeds the sweep planned
    sweeps: list[dict[str, Any]]  # sweep.json contents, each with "root"
    warnings: list[str]

    def finished(self, setting: str, method: str) -> list[Run]:
        runs = [r for r in self.runs if r.finished and r.setting == setting and r.method == method]
        return sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, str(r.dir)))

    def unfinished(self, setting: str, method: str) -> list[Run]:
        return [r for r in self.runs if not r.finished and r.setting == setting and r.method == method]

    def diverged(self, setting: str, method: str) -> list[Run]:
        return [r for r in self.unfinished(setting, method) if r.diverged is not None and not r.stale]


def _read_json(path: Path) -> tuple[Any, str]:
    try:
        return json.loads(path.read_text()), ""
    except FileNotFoundError:
        return None, f"no {path.name}"
    except (OSError, ValueError) as err:
        return None, f"unreadable {path.name} ({err})"


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def setting_label(config: dict[str, Any]) -> str:
    """A short label of the dataset and partition, e.g. ``fmnist-a0.5-if10``."""
    p = config.get("partition") or {}
    scheme = p.get("scheme", "?")
    detail = {
        "dirichlet": f"a{_fmt(p.get('alpha'))}",
        "iid": "iid",
        "pathological": f"path{_fmt(p.get('classes_per_client'))}",
        "dominant": f"dom{_fmt(p.get('iid_fraction'))}",
        "stages": f"stages{_fmt(p.get('stages'))}x{_fmt(p.get('classes_per_stage'))}",
    }.get(scheme, str(scheme))
    return f"{config.get('dataset', '?')}-{detail}-if{_fmt(p.get('imbalance', 1))}"


def method_label(config: dict[str, Any]) -> str:
    """The algorithm name, with the options that differ from what a run gets by default (the
    option defaults and the algorithm's reference options): ``mupfl(kappa=2)``."""
    from fedtail.components import apply_reference

    given = config.get("options") or {}
    plain = {"algorithm": config.get("algorithm"), "options": {}}
    apply_reference(plain)
    defaults = plain.get("options") or {}
    options = {k: v for k, v in given.items() if k not in defaults or defaults[k] != v}
    name = str(config.get("algorithm", "?"))
    if options:
        name += "(" + ",".join(f"{k}={_fmt(v)}" for k, v in sorted(options.items())) + ")"
    return name


def _valid_summary(summary: Any) -> bool:
    try:
        return all(isinstance(summary[k]["personalized_acc"], (int, float)) for k in ("final", "best"))
    except (TypeError, KeyError):
        return False


def _candidates(path: Path) -> list[Path]:
    found = {p.parent for name in ("summary.json", "config.json") for p in path.rglob(name)}
    if (path / "summary.json").is_file() or (path / "config.json").is_file():
        found.add(path)
    return sorted(found, key=lambda p: p.as_posix())


def collect(paths: list[Path]) -> Collection:
    """All runs under ``paths``; raises FedtailError for a path that does not exist."""
    warnings: list[str] = []
    runs: list[Run] = []
    seen: set[Path] = set()
    roots: dict[Path, Path] = {}  # resolved sweep root -> as spelled
    for given in paths:
        if not given.exists():
            raise FedtailError(f"report: no such folder {given}")
        base = given.parent if given.is_file() else given
        for d in _candidates(base):
            key = d.resolve()
            if key in seen:
                continue
            seen.add(key)
            run = load_run(d, warnings)
            if run is None:
                continue
            if run.sweep_root is not None:
                roots.setdefault(run.sweep_root.resolve(), run.sweep_root)
            runs.append(run)
        # a sweep folder whose runs have not started yet still has a plan
        for sj in [base / "sweep.json", *base.glob("*/sweep.json")]:
            if sj.is_file():
                roots.setdefault(sj.parent.resolve(), sj.parent)

    sweeps: list[dict[str, Any]] = []
    expected: dict[tuple[str, str], set[int]] = {}
    given_resolved = [p.resolve() for p in paths]
    for root in roots.values():
        data, problem = _read_json(root / "sweep.json")
        if data is None:
            if "unreadable" in problem:
                warnings.append(f"{root / 'sweep.json'}: {problem}")
            continue
        if not isinstance(data, dict):
            warnings.append(f"{root / 'sweep.json'}: not a JSON object; ignored")
            continue
        sweeps.append(data | {"root": str(root)})
        for entry in data.get("runs", []):
            try:
                where = (root / entry["dir"]).resolve()
                cell = (str(entry["setting"]), str(entry["method"]))
                seed = int(entry["seed"])
            except (KeyError, TypeError, ValueError):
                continue
            if any(where == g or where.is_relative_to(g) for g in given_resolved):
                expected.setdefault(cell, set()).add(seed)

    _drop_duplicate_seeds(runs, warnings)
    settings = _order([s.get("settings", []) for s in sweeps], [r.setting for r in runs], [c[0] for c in expected])
    methods = _order([s.get("methods", []) for s in sweeps], [r.method for r in runs], [c[1] for c in expected])
    methods = with_named(runs, methods, expected)
    for run in runs:
        if not run.finished:
            what = "diverged run; its cells say so" if run.diverged is not None else "unfinished run; not in the tables"
            warnings.append(f"{run.dir}: {what} ({run.problem})")
    return Collection(runs, settings, methods, expected, sweeps, warnings)


def load_run(d: Path, warnings: list[str]) -> Run | None:
    """The run in folder ``d`` (finished or not), None if it holds neither file readably."""
    config, _ = _read_json(d / "config.json")
    summary, s_problem = _read_json(d / "summary.json")
    diverged = None
    if isinstance(summary, dict) and summary.get("status") == "diverged":
        info = summary.get("diverged") or {}
        diverged = info.get("round") if isinstance(info.get("round"), int) else 0
        s_problem, summary = f"diverged at round {info.get('round', '?')}: {info.get('cause', '?')}", None
    elif summary is not None and not _valid_summary(summary):
        warnings.append(f"{d / 'summary.json'}: lacks final/best personalized_acc; treated as unfinished")
        s_problem, summary = "summary.json without final/best personalized_acc", None
    if not isinstance(config, dict) or "algorithm" not in config:
        if summary is None:
            if (d / "summary.json").exists() or (d / "config.json").exists():
                warnings.append(f"{d}: neither a readable config.json nor summary.json; skipped")
            return None
        config = {k: summary[k] for k in ("algorithm", "dataset", "seed") if k in summary} or None
    seed = config.get("seed") if config else None
    problem = ""
    if summary is None:
        failed = d / "FAILED"
        problem = failed.read_text().strip().splitlines()[0] if failed.is_file() and failed.read_text().strip() else s_problem
    m = _SEED_DIR.fullmatch(d.name)
    absolute = d.resolve()
    if m and (seed is None or seed == int(m.group(1))) and len(absolute.parents) >= 3:
        layout_root = d.parent.parent.parent if len(d.parts) >= 3 else absolute.parents[2]
        run = Run(d, absolute.parents[1].name, absolute.parent.name, int(m.group(1)), config, summary, layout_root, problem)
    else:
        if config is None or "partition" not in config:
            warnings.append(f"{d}: no config.json with a partition; grouped under setting '?'")
        run = Run(d, setting_label(config or {}), method_label(config or {}), seed, config, summary, None, problem)
    run.diverged = diverged
    if summary is not None and "last10" not in summary:
        _derive_last10(run)
    return run


def _derive_last10(run: Run) -> None:
    """Give a finished run whose ``summary.json`` predates ``last10`` that entry, computed from its
    ``metrics.jsonl`` as the engine computes it now (marked ``"derived": "metrics.jsonl"``); without
    evaluation rows it stays absent (its cell shows the seeds that have one)."""
    rows = run.evaluations()
    if rows:
        run.summary["last10"] = reductions(rows, rows, SUMMARY_KEYS)["last10"] | {"derived": "metrics.jsonl"}


def _drop_duplicate_seeds(runs: list[Run], warnings: list[str]) -> None:
    seen: dict[tuple[str, str, int], Run] = {}
    keep: list[Run] = []
    for run in runs:
        if run.finished and run.seed is not None:
            key = (run.setting, run.method, run.seed)
            if key in seen:
                warnings.append(
                    f"{run.dir}: same setting/method/seed as {seen[key].dir} ({'/'.join(map(str, key))}); ignored"
                )
                continue
            seen[key] = run
        keep.append(run)
    runs[:] = keep


def _order(planned: list[list[str]], found: list[str], expected: list[str]) -> list[str]:
    present = set(found) | set(expected)
    out: list[str] = []
    for names in planned:
        out += [n for n in names if n in present and n not in out]
    for n in [*found, *expected]:  # one at a time: runs of one cell repeat its names
        if n not in out:
            out.append(n)
    return out
