"""``fedtail sweep``: a grid of runs (settings × methods × seeds) described by one TOML file.

File format::

    out = "runs/table2"        # folder of the runs, relative to the working directory
    seeds = [0, 1]             # one run per seed of every (setting, method)
    jobs = 2                   # runs in parallel (default 1; --jobs overrides)

    [base]                     # RunConfig keys, as `fedtail run --config FILE` accepts them
    dataset = "fmnist"
    [base.partition]
    scheme = "dirichlet"
    [base.train]
    lr = 0.005

    [settings."a0.5-if10"]     # deep-merged over [base]; optional (one setting "default")
    partition = { alpha = 0.5, imbalance = 10 }

    [methods.fedavg]           # algorithm defaults to the table's name
    [methods."mupfl-k2"]
    algorithm = "mupfl"        # optional
    options = { kappa = 2 }    # the algorithm's options (what --set mupfl.kappa=2 sets)
    train = { lr = 0.01 }      # any other RunConfig override, deep-merged last

A run's config is ``base ⊕ settings[s] ⊕ method overrides ⊕ {algorithm, options, seed}``,
validated by :func:`fedtail.config.build_config` (the code path of ``fedtail run``) for every
run before any run starts. ``seed`` comes from ``seeds`` only; ``algorithm`` only from the
methods. Runs go to ``{out}/{setting}/{method}/seed{seed}``.

Order (deterministic): settings in file order, then methods in file order, then seeds in
list order, so the columns of the report's tables (settings) fill one after the other. With
``jobs > 1`` runs start in that order as workers free up.

Resuming: a folder whose ``summary.json`` exists and whose ``config.json`` equals the planned
config (ignoring :data:`IGNORED_KEYS`, which do not change results) is *done* and skipped; a
folder without ``summary.json`` (killed or failed run) is *pending*: it is cleared and rerun;
a finished folder with a different config is *stale*: an error unless ``force``; an unfinished
folder named on the command line of a live process (a ``fedtail run`` writing it) is *busy*
and left alone. ``{out}/sweep.lock`` keeps two sweeps off the same folder.

Each run executes in its own process (``python -m fedtail.report._runone DIR``, the config on
stdin, output in ``DIR/run.log``), so one crashing run does not stop the others.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from fedtail.config import RunConfig, build_config, merge
from fedtail.errors import ConfigError
from fedtail.report.machine import machine_info
from fedtail.report.runfiles import write_json

SWEEP_KEYS = ("out", "seeds", "jobs", "base", "settings", "methods")
IGNORED_KEYS = ("workers",)  # config keys that do not change a run's results
DEFAULT_SETTING = "default"
ORDER = "settings (file order), then methods (file order), then seeds (list order)"
LOG_NAME = "run.log"
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


@dataclass(frozen=True)
class RunStatus:
    run: PlannedRun
    state: str  # done | pending | stale
    note: str = ""
    diffs: tuple[str, ...] = ()


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


@dataclass
class RunOutcome:
    run: PlannedRun
    ok: bool
    minutes: float
    summary: dict[str, Any] | None = None
    error: str = ""


# ---------------------------------------------------------------------------------------------
# Reading the file and expanding the plan


def _load(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"sweep: no such file {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep {path}: not valid TOML ({err})") from None


def _normalize(table: dict[str, Any]) -> dict[str, Any]:
    """Flag-named keys (``alpha = 0.5``) to config paths, exactly as ``run --config`` does."""
    from fedtail.cli.main import flags_to_nested

    return flags_to_nested(table)


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


def load_sweep(
    path: str | Path,
    *,
    out: str | Path | None = None,
    settings: list[str] | None = None,
    methods: list[str] | None = None,
) -> Sweep:
    """Parse a sweep file and build (validate) the RunConfig of every run; raises ConfigError."""
    path = Path(path)
    raw = _load(path)
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SWEEP_KEYS)}")

    out_value = out if out is not None else raw.get("out")
    if not out_value or not isinstance(out_value, (str, Path)):
        raise ConfigError(f"sweep {path}: `out` (the folder of the runs) must be a non-empty string")
    seeds = raw.get("seeds")
    if (
        not isinstance(seeds, list)
        or not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
    ):
        raise ConfigError(f"sweep {path}: `seeds` must be a non-empty list of integers >= 0 (got {seeds!r})")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"sweep {path}: `seeds` has duplicates ({seeds})")
    jobs = raw.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"sweep {path}: `jobs` must be an integer >= 1 (got {jobs!r})")

    base = _normalize(_table(raw.get("base", {}), f"sweep {path}: [base]"))
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
        table = _normalize(_table(table, f"sweep {path}: [settings.{name}]"))
        for key in ("seed", "algorithm"):
            if key in table:
                raise ConfigError(f"sweep {path}: [settings.{name}] {key}: not allowed in a setting")
        settings_norm[name] = table
    methods_norm: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}
    for name, table in method_tables.items():
        table = dict(_table(table, f"sweep {path}: [methods.{name}]"))
        algorithm = table.pop("algorithm", name)
        if not isinstance(algorithm, str):
            raise ConfigError(f"sweep {path}: [methods.{name}] algorithm must be a string (got {algorithm!r})")
        options = _table(table.pop("options", {}), f"sweep {path}: [methods.{name}] options")
        rest = _normalize(table)
        if "seed" in rest:
            raise ConfigError(f"sweep {path}: [methods.{name}] seed: set it in the top-level `seeds` list")
        methods_norm[name] = (algorithm, options, rest)

    out_dir = Path(out_value)
    runs: list[PlannedRun] = []
    for s_name, s_table in settings_norm.items():
        for m_name, (algorithm, options, rest) in methods_norm.items():
            config_raw = merge(merge(merge(base, s_table), rest), {"algorithm": algorithm, "options": options})
            for seed in seeds:
                try:
                    config = build_config(config_raw | {"seed": seed})
                except ConfigError as err:
                    raise ConfigError(f"sweep {path}: setting {s_name!r}, method {m_name!r}: {err}") from None
                runs.append(PlannedRun(s_name, m_name, seed, out_dir / s_name / m_name / f"seed{seed}", config))

    pick_s = _pick(settings, list(settings_norm), "--settings")
    pick_m = _pick(methods, list(methods_norm), "--methods")
    selected = [r for r in runs if r.setting in pick_s and r.method in pick_m]
    return Sweep(path, out_dir, list(seeds), jobs, list(settings_norm), list(methods_norm), runs, selected)


# ---------------------------------------------------------------------------------------------
# Status of the folders on disk


def config_diff(old: Any, new: Any, ignore: tuple[str, ...] = IGNORED_KEYS, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, as ``key: old -> new`` (``ignore`` applies at top level)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in list(old) + [k for k in new if k not in old]:
            if not prefix and key in ignore:
                continue
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                out.append(f"{name}: (absent) -> {json.dumps(new[key])}")
            elif key not in new:
                out.append(f"{name}: {json.dumps(old[key])} -> (absent)")
            else:
                out.extend(config_diff(old[key], new[key], ignore, name))
        return out
    return [] if old == new else [f"{prefix}: {json.dumps(old)} -> {json.dumps(new)}"]


def busy_dirs() -> set[Path]:
    """Folders named on the command line of a live process (other than this one).

    An unfinished run folder that a running ``fedtail run`` (or another sweep's run) is writing
    must not be cleared. Linux only (``/proc``); elsewhere nothing is reported busy.
    """
    out: set[Path] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        for arg in args:
            text = arg.decode(errors="replace")
            if text.startswith("--out="):
                text = text[len("--out="):]
            if not text or text.startswith("-"):
                continue
            try:
                out.add((cwd / text).resolve())
            except (OSError, RuntimeError, ValueError):
                continue
    return out


def run_status(run: PlannedRun, busy: set[Path] | frozenset = frozenset()) -> RunStatus:
    """done, pending, stale, or busy (unfinished and named by a live process: left alone)."""
    d = run.dir
    if (d / "summary.json").is_file():
        try:
            existing = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            return RunStatus(run, "stale", "finished, but config.json is missing or unreadable")
        diffs = tuple(config_diff(existing, run.config_dict()))
        if diffs:
            return RunStatus(run, "stale", "finished with a different config: " + "; ".join(diffs), diffs)
        return RunStatus(run, "done")
    if d.is_dir() and any(d.iterdir()):
        if d.resolve() in busy:
            return RunStatus(run, "busy", "unfinished and in use by a running process; left alone")
        failed = d / "FAILED"
        why = failed.read_text().strip().splitlines()[0] if failed.is_file() else "no summary.json"
        return RunStatus(run, "pending", f"unfinished folder ({why}); it will be cleared")
    return RunStatus(run, "pending")


def check_stale(statuses: list[RunStatus], force: bool) -> None:
    stale = [s for s in statuses if s.state == "stale"]
    if stale and not force:
        lines = [f"{s.run.dir}: {s.note}" for s in stale]
        raise ConfigError(
            f"{len(stale)} finished run folder(s) hold a different config; pass --force to rerun them "
            "(their results are replaced) or change `out`:\n  " + "\n  ".join(lines)
        )


class SweepLock:
    """``{out}/sweep.lock``: one sweep at a time per folder (a lock of a dead process is taken over)."""

    def __init__(self, out: Path) -> None:
        self.path = out / "sweep.lock"
        self.held = False

    def __enter__(self) -> "SweepLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        host = os.uname().nodename if hasattr(os, "uname") else ""
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    other = json.loads(self.path.read_text())
                    pid, other_host = int(other["pid"]), other.get("host", "")
                except (OSError, ValueError, KeyError, TypeError):
                    pid, other_host = -1, host
                if pid > 0 and other_host == host and _alive(pid):
                    raise ConfigError(
                        f"another fedtail sweep (pid {pid}) is running on {self.path.parent}; "
                        f"wait for it or stop it (if it is gone, delete {self.path})"
                    ) from None
                self.path.unlink(missing_ok=True)  # left by a dead sweep
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"pid": os.getpid(), "host": host, "started": _now()}, fh)
            self.held = True
            return self
        raise ConfigError(f"could not create {self.path}")

    def __exit__(self, *exc: Any) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------
# sweep.json


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def _acc(summary: dict[str, Any] | None, which: str) -> float | None:
    try:
        return summary[which]["personalized_acc"]  # type: ignore[index]
    except (TypeError, KeyError):
        return None


class SweepRecord:
    """``{out}/sweep.json``: the plan (every run of the file) and each run's status."""

    def __init__(self, sweep: Sweep, statuses: list[RunStatus], command: str, jobs: int) -> None:
        self.sweep = sweep
        self.path = sweep.out / "sweep.json"
        self.lock = threading.Lock()
        previous: dict[str, dict[str, Any]] = {}
        try:
            old = json.loads(self.path.read_text())
            previous = {r["dir"]: r for r in old.get("runs", []) if isinstance(r, dict) and "dir" in r}
        except (OSError, ValueError, AttributeError):
            pass
        selected = {r.dir for r in sweep.selected}
        self.entries: dict[Path, dict[str, Any]] = {}
        for st in statuses:
            run = st.run
            rel = run.dir.relative_to(sweep.out).as_posix()
            entry = {
                "setting": run.setting,
                "method": run.method,
                "seed": run.seed,
                "algorithm": run.config.algorithm,
                "options": run.config.options,
                "dir": rel,
                "status": st.state,
                "selected": run.dir in selected,
            }
            old = previous.get(rel, {})
            if st.state == "done":
                # keep what an earlier invocation measured
                for key in ("minutes", "final_personalized_acc", "best_personalized_acc"):
                    if key in old:
                        entry[key] = old[key]
            if st.note:
                entry["note"] = st.note
            self.entries[run.dir] = entry
        self.data: dict[str, Any] = {
            "file": str(sweep.file),
            "command": command,
            "out": str(sweep.out),
            "order": ORDER,
            "seeds": sweep.seeds,
            "settings": sweep.settings,
            "methods": sweep.methods,
            "jobs": jobs,
            "machine": machine_info(),
            "started": _now(),
        }

    def update(self, outcome: RunOutcome | None = None, status: str | None = None) -> None:
        with self.lock:
            if outcome is not None:
                entry = self.entries[outcome.run.dir]
                entry["status"] = status or ("done" if outcome.ok else "failed")
                entry["minutes"] = round(outcome.minutes, 3)
                entry.pop("note", None)
                if outcome.ok:
                    entry.pop("error", None)
                    entry["final_personalized_acc"] = _acc(outcome.summary, "final")
                    entry["best_personalized_acc"] = _acc(outcome.summary, "best")
                else:
                    entry["error"] = outcome.error
            self.data["updated"] = _now()
            self.sweep.out.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.data | {"runs": list(self.entries.values())})

    def mark(self, run: PlannedRun, status: str) -> None:
        with self.lock:
            self.entries[run.dir]["status"] = status


# ---------------------------------------------------------------------------------------------
# Executing runs


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or "(empty log)"


class Runner:
    """Runs planned runs in subprocesses, at most ``jobs`` at a time."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.procs: dict[Path, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("FEDTAIL_PROGRESS", None)  # the child's output goes to a log file
        return env

    def run_one(self, run: PlannedRun) -> RunOutcome:
        start = time.perf_counter()
        if self.stopped.is_set():
            return RunOutcome(run, False, 0.0, error="not started (sweep interrupted)")
        if run.dir.exists():
            shutil.rmtree(run.dir)
        run.dir.mkdir(parents=True)
        log = run.dir / LOG_NAME
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fedtail.report._runone", str(run.dir)],
                stdin=subprocess.PIPE,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self._env(),
                text=True,
            )
            with self.lock:
                self.procs[run.dir] = proc
            try:
                proc.communicate(json.dumps(run.config_dict()))
            finally:
                with self.lock:
                    self.procs.pop(run.dir, None)
        minutes = (time.perf_counter() - start) / 60
        summary = None
        if proc.returncode == 0:
            try:
                summary = json.loads((run.dir / "summary.json").read_text())
            except (OSError, ValueError):
                summary = None
        if summary is None:
            return RunOutcome(run, False, minutes, error=f"exit code {proc.returncode}\n" + tail(log))
        return RunOutcome(run, True, minutes, summary)

    def stop(self) -> None:
        self.stopped.set()
        with self.lock:
            procs = list(self.procs.values())
        for proc in procs:  # only the processes this runner started
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def map(self, runs: list[PlannedRun], on_done: Callable[[RunOutcome], None]) -> list[RunOutcome]:
        outcomes: list[RunOutcome] = []
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="sweep")
        try:
            futures = [pool.submit(self.run_one, run) for run in runs]  # FIFO: plan order
            for future in as_completed(futures):
                outcome = future.result()
                outcomes.append(outcome)
                on_done(outcome)
        except BaseException:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        order = {run.dir: i for i, run in enumerate(runs)}
        return sorted(outcomes, key=lambda o: order[o.run.dir])


def describe_outcome(outcome: RunOutcome) -> str:
    """One line of Rich markup per finished run."""
    from rich.markup import escape

    where = escape(str(outcome.run.dir))
    if not outcome.ok:
        return f"[red]failed[/] {where} after {outcome.minutes:.1f} min"
    s = outcome.summary or {}
    best = s.get("best", {})
    fmt = lambda v: "—" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    return (
        f"[green]done[/] {where}: final {fmt(_acc(s, 'final'))}, "
        f"best {fmt(_acc(s, 'best'))} (round {best.get('round', '?')}), {outcome.minutes:.1f} min"
    )


def execute(
    sweep: Sweep,
    statuses: list[RunStatus],
    *,
    jobs: int,
    command: str,
    console: Any,
    force: bool = False,
) -> list[RunOutcome]:
    """Run the selected pending (and, with ``force``, stale) runs; writes ``{out}/sweep.json``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    selected = {r.dir for r in sweep.selected}
    todo = [
        st.run
        for st in statuses
        if st.run.dir in selected and (st.state == "pending" or (force and st.state == "stale"))
    ]
    record = SweepRecord(sweep, statuses, command, jobs)
    for run in todo:
        record.mark(run, "queued")
    record.update()
    if not todo:
        return []
    progress = Progress(
        TextColumn("[bold]runs"),
        MofNCompleteColumn(),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal and os.environ.get("FEDTAIL_PROGRESS") != "1",
    )
    runner = Runner(jobs)
    with progress:
        task = progress.add_task("runs", total=len(todo))

        def on_done(outcome: RunOutcome) -> None:
            record.update(outcome)
            progress.console.print(describe_outcome(outcome), highlight=False, soft_wrap=True)
            progress.advance(task)

        try:
            outcomes = runner.map(todo, on_done)
        except BaseException:
            for run in todo:
                entry = record.entries[run.dir]
                if entry["status"] == "queued":
                    entry["status"] = "interrupted"
            record.update()
            raise
    return outcomes


def oversubscription(sweep: Sweep, jobs: int) -> str | None:
    """A warning when jobs × workers (× threads) exceeds the machine's cores."""
    if not sweep.selected:
        return None
    per_run = max(r.config.workers * r.config.threads for r in sweep.selected)
    cores = os.cpu_count() or 1
    if jobs * per_run > cores:
        return (
            f"{jobs} parallel runs × {per_run} processes/threads each exceeds the {cores} cores; "
            "runs will compete for CPU (results do not change, wall times do)"
        )
    return None


def plan_table(sweep: Sweep, statuses: list[RunStatus]) -> Any:
    """A Rich table of the selected runs, in execution order, with their status."""
    from rich.markup import escape
    from rich.table import Table

    selected = {r.dir for r in sweep.selected}
    table = Table(title=escape(f"{sweep.file}: {len(selected)} runs -> {sweep.out}"))
    for col in ("#", "setting", "method", "seed", "algorithm", "status", "note"):
        table.add_column(col, overflow="fold")
    style = {"done": "green", "pending": "yellow", "stale": "red", "busy": "magenta"}
    for i, st in enumerate((s for s in statuses if s.run.dir in selected), 1):
        run = st.run
        algo = run.config.algorithm + (f" {json.dumps(run.config.options)}" if run.config.options else "")
        table.add_row(
            str(i), escape(run.setting), escape(run.method), str(run.seed), escape(algo),
            f"[{style[st.state]}]{st.state}[/]", escape(st.note),
        )
    return table


def count(statuses: list[RunStatus], sweep: Sweep) -> dict[str, int]:
    selected = {r.dir for r in sweep.selected}
    out = {"done": 0, "pending": 0, "stale": 0, "busy": 0}
    for st in statuses:
        if st.run.dir in selected:
            out[st.state] += 1
    return out


def sweep_command(
    file: Path,
    *,
    jobs: int | None,
    methods: list[str] | None,
    settings: list[str] | None,
    dry_run: bool,
    force: bool,
    out: Path | None,
    console: Any,
    stdout: Any,
) -> int:
    """``fedtail sweep``: 0 when every selected run is finished, 1 when a run failed.

    Bad input (the file, a stale folder, another sweep holding the lock) raises ConfigError
    before any run starts.
    """
    import shlex

    from rich.markup import escape

    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1 (got {jobs})")
    plan = load_sweep(file, out=out, settings=settings, methods=methods)
    if dry_run:
        statuses = [run_status(r, busy_dirs()) for r in plan.runs]
        stdout.print(plan_table(plan, statuses))
        summary = ", ".join(f"{n} {state}" for state, n in count(statuses, plan).items())
        stdout.print(summary + " (dry run: nothing was run)", soft_wrap=True)
        return 0
    n_jobs = jobs or plan.jobs
    argv = ["fedtail", "sweep", str(file)]
    for flag, value in (("--jobs", jobs), ("--methods", methods), ("--settings", settings), ("--out", out)):
        if value is not None:
            argv += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    argv += ["--force"] if force else []
    say = lambda text: console.print(text, highlight=False, soft_wrap=True)  # noqa: E731
    with SweepLock(plan.out):
        busy = busy_dirs()
        statuses = [run_status(r, busy) for r in plan.runs]
        selected = {r.dir for r in plan.selected}
        check_stale([s for s in statuses if s.run.dir in selected], force)
        counts = count(statuses, plan)
        todo = counts["pending"] + (counts["stale"] if force else 0)
        say(
            escape(
                f"sweep {file}: {len(plan.selected)} runs, {counts['done']} done, {todo} to run, "
                f"{n_jobs} in parallel -> {plan.out}"
            )
        )
        note = oversubscription(plan, n_jobs)
        if note:
            say(f"[yellow]warning:[/] {escape(note)}")
        for st in statuses:
            if st.state == "busy" and st.run.dir in selected:
                say(f"[yellow]warning:[/] {escape(str(st.run.dir))}: {escape(st.note)}")
        outcomes = execute(plan, statuses, jobs=n_jobs, command=shlex.join(argv), console=console, force=force)
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        say(f"[bold red]failed:[/] {escape(str(o.run.dir))}\n{escape(o.error)}")
    say(escape(f"{len(outcomes) - len(failed)} runs finished, {len(failed)} failed; plan in {plan.out / 'sweep.json'}"))
    return 1 if failed else 0
