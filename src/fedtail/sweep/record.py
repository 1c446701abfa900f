"""``{out}/sweep.json``: the plan (every run of the file) and the status of each run.

Statuses: done / pending / stale / busy (from the folders), then queued, failed or
interrupted as the sweep goes; finished runs keep their minutes and accuracies.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from fedtail.report.machine import machine_info
from fedtail.report.runfiles import write_json
from fedtail.sweep.pool import RunOutcome
from fedtail.sweep.spec import ORDER, PlannedRun, Sweep
from fedtail.sweep.status import RunStatus, now

_KEPT = ("minutes", "final_personalized_acc", "best_personalized_acc")


def personalized_acc(summary: dict[str, Any] | None, which: str) -> float | None:
    """``summary[which]["personalized_acc"]`` (``which``: final or best), None when absent."""
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
            }
            old = previous.get(rel, {})
            if st.state == "done":
                # keep what an earlier invocation measured
                for key in _KEPT:
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
            "started": now(),
        }

    def update(self, outcome: RunOutcome | None = None, status: str | None = None) -> None:
        """Record a finished run (if given) and write the file."""
        with self.lock:
            if outcome is not None:
                entry = self.entries[outcome.run.dir]
                entry["status"] = status or ("done" if outcome.ok else "failed")
                entry["minutes"] = round(outcome.minutes, 3)
                entry.pop("note", None)
                if outcome.ok:
                    entry.pop("error", None)
                    entry["final_personalized_acc"] = personalized_acc(outcome.summary, "final")
                    entry["best_personalized_acc"] = personalized_acc(outcome.summary, "best")
                else:
                    entry["error"] = outcome.error
            self.data["updated"] = now()
            self.sweep.out.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.data | {"runs": list(self.entries.values())})

    def mark(self, run: PlannedRun, status: str) -> None:
        with self.lock:
            self.entries[run.dir]["status"] = status

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
                entry["status"] = "interrupted"
        self.update()
