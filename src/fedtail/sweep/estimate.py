"""How long a sweep's unfinished runs will take, guessed from the wall times of its finished runs.

A long sweep (Table II of MuPFL is 56 runs of 15 to 60 minutes) is run over several sittings, so
``fedtail sweep --dry-run`` says how much is left. A pending run is expected to take the mean wall
time of the finished runs of the same method in the same setting, else of the same method in any
setting, else of the same algorithm; a run in progress the unfinished share of its rounds. The
finished runs were timed under the same load (``jobs`` runs sharing the machine), so the total
divided by ``jobs`` approximates the wall time left. A run with nothing to go by has no estimate.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from fedtail.sweep.spec import PlannedRun
from fedtail.sweep.status import RunStatus

TAIL_BYTES = 1 << 20  # a metrics.jsonl record is a few kB; its last megabyte holds the last record


@dataclass(frozen=True)
class Estimate:
    minutes: dict[Path, float | None]  # per run folder: done -> its wall time; unfinished -> time left
    left: float  # minutes of the unfinished runs that have an estimate
    unknown: int  # unfinished runs without one

    def wall_hours(self, jobs: int) -> float:
        return self.left / 60 / max(jobs, 1)


def wall_minutes(run_dir: Path) -> float | None:
    """A finished run's wall time from its ``summary.json``, or None."""
    try:
        value = json.loads((run_dir / "summary.json").read_text()).get("wall_time_s")
    except (OSError, ValueError, AttributeError):
        return None
    return value / 60 if isinstance(value, (int, float)) and value >= 0 else None


def rounds_done(run_dir: Path) -> int:
    """The last round recorded in a run's ``metrics.jsonl`` (0 if none)."""
    path = run_dir / "metrics.jsonl"
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - TAIL_BYTES))
            lines = fh.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            value = json.loads(line).get("round")
        except (ValueError, AttributeError):
            continue  # a line cut by the seek, or one being written
        if isinstance(value, int):
            return value
    return 0


class WallTimes:
    """Wall minutes of finished runs, by kind, and the guess for a run from the closest kind.

    Kinds, closest first: same method and setting, same method, same algorithm. A sweep adds each
    run it finishes, so its guesses for the later runs improve as it goes.
    """

    def __init__(self) -> None:
        self.times: dict[tuple[str, ...], list[float]] = {}
        self.lock = threading.Lock()

    @staticmethod
    def _keys(run: PlannedRun) -> tuple[tuple[str, ...], ...]:
        return (("method", run.method, run.setting), ("method", run.method), ("algorithm", run.config.algorithm))

    def add(self, run: PlannedRun, minutes: float) -> None:
        with self.lock:
            for key in self._keys(run):
                self.times.setdefault(key, []).append(minutes)

    def expect(self, run: PlannedRun) -> float | None:
        """Expected wall minutes of the whole run, or None when no finished run is like it."""
        with self.lock:
            return next((fmean(self.times[k]) for k in self._keys(run) if k in self.times), None)


def measured(statuses: list[RunStatus]) -> dict[Path, float | None]:
    """The wall minutes of the finished runs among ``statuses`` (None where not recorded)."""
    return {st.run.dir: wall_minutes(st.run.dir) for st in statuses if st.state == "done"}


def learned(statuses: list[RunStatus], minutes: dict[Path, float | None] | None = None) -> WallTimes:
    """The wall times of the finished runs among ``statuses`` (``minutes``: already read)."""
    minutes = measured(statuses) if minutes is None else minutes
    times = WallTimes()
    for st in statuses:
        if minutes.get(st.run.dir) is not None:
            times.add(st.run, minutes[st.run.dir])
    return times


def estimate(
    statuses: list[RunStatus], selected: set[Path] | None = None, times: WallTimes | None = None
) -> Estimate:
    """Minutes per run (done: measured; pending or busy: expected remaining) and the total left.

    The guesses come from ``times``, by default the finished runs among ``statuses``; only the
    ``selected`` unfinished runs (all by default) count towards the time left.
    """
    minutes = measured(statuses)
    times = learned(statuses, minutes) if times is None else times
    left, unknown = 0.0, 0
    for st in statuses:
        if st.state not in ("pending", "busy") or (selected is not None and st.run.dir not in selected):
            continue
        whole = times.expect(st.run)
        if whole is None:
            minutes[st.run.dir] = None
            unknown += 1
            continue
        share = 1.0
        if st.state == "busy":
            share = max(0.0, 1 - rounds_done(st.run.dir) / max(st.run.config.rounds, 1))
        minutes[st.run.dir] = whole * share
        left += whole * share
    return Estimate(minutes, left, unknown)


def describe(est: Estimate, jobs: int) -> str:
    """``about 12.3 h of runs left (6.2 h at 2 in parallel)``, with the runs nothing is known of."""
    if est.left == 0 and est.unknown == 0:
        return "nothing left to run"
    text = f"about {est.left / 60:.1f} h of runs left ({est.wall_hours(jobs):.1f} h at {jobs} in parallel)"
    if est.unknown:
        text += f"; {est.unknown} run(s) not estimated (no finished run of their method or algorithm yet)"
    return text
