"""``{out}/sweep.json``: the plan (every run of the file) and the status of each run.

Statuses: done / partial / pending / stale / busy (from the folders), then queued, failed, skipped,
deferred (left for a later sweep by ``--time-limit``) or interrupted as the sweep goes; finished runs keep their minutes and accuracies.

Several sweeps (of one file or of several) may share ``{out}``. Each write re-reads the file
under an exclusive ``flock`` and keeps the runs of the other plans; for a run in both, the entry
set last wins (each entry's ``at``, UTC to the microsecond), except that "skipped" never replaces
an outcome (done or failed). The header (file, command, jobs,
machine, times) is the last writer's.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fedtail.machine import machine_info
from fedtail.report.runfiles import write_json
from fedtail.sweep.pool import RunOutcome
from fedtail.sweep.spec import ORDER, PlannedRun, Sweep
from fedtail.sweep.status import RunStatus, folder_lock, now

_last_stamp = datetime.min.replace(tzinfo=timezone.utc)
_stamp_lock = threading.Lock()


def _stamp() -> str:
    """When an entry's status was set: UTC to the microsecond, compared as text.

    Strictly increasing within a process, so two updates in one clock tick still order.
    """
    global _last_stamp
    with _stamp_lock:
        t = max(datetime.now(timezone.utc), _last_stamp + timedelta(microseconds=1))
        _last_stamp = t
    return t.isoformat(timespec="microseconds")


def _read_runs(path: Path) -> dict[str, dict[str, Any]]:
    try:
        old = json.loads(path.read_text())
        return {r["dir"]: r for r in old.get("runs", []) if isinstance(r, dict) and "dir" in r}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}

def _wins(theirs: dict[str, Any], mine: dict[str, Any]) -> bool:
    """Whether another sweep's entry of a run replaces this sweep's: the one set later, except
    that "skipped" (the sweep saw the run busy) never replaces an outcome (done or failed): the
    sweep that saw the run busy may record that after the other sweep recorded the outcome."""
    outcome = ("done", "failed", "diverged")
    if theirs.get("status") == "skipped" and mine.get("status") in outcome:
        return False
    if mine.get("status") == "skipped" and theirs.get("status") in outcome:
        return True
    return str(theirs.get("at", "")) > str(mine.get("at", ""))


def supersede_records(out: Path, moves: list[tuple[Path, Path]]) -> None:
    """After ``--supersede`` moved run folders: their entries leave ``{out}/sweep.json`` for the
    ``sweep.json`` of the folder they went to (``{out}/../superseded/TAG/{out name}``), which gets
    the live file's header where it has none. The moved runs' finish times, minutes and accuracies
    thus stay with the runs, and ``out``'s record (and the report's "Runs finished" line) speaks
    only of the runs still there."""
    if not moves:
        return
    src = out / "sweep.json"
    with folder_lock(out):
        try:
            live = json.loads(src.read_text())
        except (OSError, ValueError):
            return  # no record of the moved runs to carry
        if not isinstance(live, dict):
            return
        runs = _read_runs(src)
        by_root: dict[Path, list[dict[str, Any]]] = {}
        for old, new in moves:
            rel = old.resolve().relative_to(out.resolve())
            entry = runs.pop(rel.as_posix(), None)
            if entry is not None:  # new == root / rel
                by_root.setdefault(new.parents[len(rel.parts) - 1], []).append(entry)
        if not by_root:
            return
        write_json(src, live | {"runs": list(runs.values())})
    header = {k: v for k, v in live.items() if k != "runs"}
    for root, entries in by_root.items():
        root.mkdir(parents=True, exist_ok=True)
        with folder_lock(root):
            path = root / "sweep.json"
            kept = _read_runs(path)
            try:
                head = {k: v for k, v in json.loads(path.read_text()).items() if k != "runs"}
            except (OSError, ValueError, AttributeError):
                head = header
            kept.update({e["dir"]: e for e in entries})
            write_json(path, head | {"runs": list(kept.values())})


_KEPT = ("minutes", "final_personalized_acc", "best_personalized_acc")


def personalized_acc(summary: dict[str, Any] | None, which: str) -> float | None:
    """``summary[which]["personalized_acc"]`` (``which``: final or best), None when absent."""
    try:
        return summary[which]["personalized_acc"]  # type: ignore[index]
    except (TypeError, KeyError):
        return None


def _set_accuracies(entry: dict[str, Any], summary: dict[str, Any] | None) -> None:
    entry["final_personalized_acc"] = personalized_acc(summary, "final")
    entry["best_personalized_acc"] = personalized_acc(summary, "best")


class SweepRecord:
    """``{out}/sweep.json``: the plan (every run of the file) and each run's status."""

    def __init__(self, sweep: Sweep, statuses: list[RunStatus], command: str, jobs: int) -> None:
        self.sweep = sweep
        self.path = sweep.out / "sweep.json"
        self.lock = threading.Lock()
        previous = _read_runs(self.path)
        selected = sweep.selected_dirs()
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
                "at": _stamp(),
            }
            old = previous.get(rel, {})
            if st.state == "done":
                # keep what an earlier invocation measured, and when the run finished
                for key in _KEPT:
                    if key in old:
                        entry[key] = old[key]
                if old.get("status") == "done" and "at" in old:
                    entry["at"] = old["at"]
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
            "started": now(),
        }

    def update(self, outcome: RunOutcome | None = None, status: str | None = None) -> None:
        """Record a finished run (if given) and write the file."""
        with self.lock:
            if outcome is not None and outcome.deferred:
                entry = self.entries[outcome.run.dir]
                entry["status"], entry["note"], entry["at"] = "deferred", outcome.deferred, _stamp()
            elif outcome is not None and outcome.skipped and outcome.summary is None:
                entry = self.entries[outcome.run.dir]
                entry["status"], entry["note"], entry["at"] = "skipped", outcome.skipped, _stamp()
            elif outcome is not None and outcome.skipped:
                # finished by another sweep: its results, and the "at" of this sweep's last news, so
                # that the other sweep's own entry (with the run's minutes) wins where it wrote one
                entry = self.entries[outcome.run.dir]
                entry.update(status="done", note=outcome.skipped)
                _set_accuracies(entry, outcome.summary)
            elif outcome is not None and outcome.diverged:
                entry = self.entries[outcome.run.dir]
                entry.update(status="diverged", note=outcome.diverged, at=_stamp(), minutes=round(outcome.minutes, 3))
                entry.pop("error", None)
            elif outcome is not None:
                entry = self.entries[outcome.run.dir]
                entry["status"] = status or ("done" if outcome.ok else "failed")
                entry["at"] = _stamp()
                entry["minutes"] = round(outcome.minutes, 3)
                entry.pop("note", None)
                if outcome.ok:
                    entry.pop("error", None)
                    _set_accuracies(entry, outcome.summary)
                else:
                    entry["error"] = outcome.error
            self.data["updated"] = now()
            self.sweep.out.mkdir(parents=True, exist_ok=True)
            with folder_lock(self.sweep.out):
                write_json(self.path, self.data | {"runs": self._merged(_read_runs(self.path))})

    def _merged(self, on_disk: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """This plan's entries (another sweep's where it set one later), then the other plans' runs."""
        mine = []
        for entry in self.entries.values():
            theirs = on_disk.pop(entry["dir"], None)
            if theirs is not None and _wins(theirs, entry):
                entry = theirs | {"selected": entry["selected"]}
            mine.append(entry)
        return mine + list(on_disk.values())

    def mark(self, run: PlannedRun, status: str) -> None:
        with self.lock:
            self.entries[run.dir].update(status=status, at=_stamp())

    def queue(self, runs: list[PlannedRun]) -> None:
        """Mark ``runs`` queued and write the file (before any of them starts)."""
        for run in runs:
            self.mark(run, "queued")
        self.update()

    def interrupt(self, runs: list[PlannedRun]) -> None:
        """After Ctrl-C: the runs of ``runs`` still queued become interrupted; writes the file."""
        for run in runs:
            entry = self.entries[run.dir]
            if entry["status"] == "queued":
                entry.update(status="interrupted", at=_stamp())
        self.update()
