"""How long a sweep's unfinished runs will take, guessed from the wall times of its finished runs.

A long sweep (Table II of MuPFL is 56 runs of 15 to 60 minutes) is run over several sittings, so
``fedtail sweep --dry-run`` says how much is left. A pending run is expected to take the mean wall
time of the finished runs of the same method in the same setting; else of the same method in the
other settings, scaled by how much longer the other methods took in its setting (a long tail with
imbalance factor 100 keeps about 60 % of the samples of one with factor 10, and its runs are faster
by about as much); else likewise of the same algorithm. A run in progress is expected to take the
unfinished share of its rounds, and so is a partial run (resumed from its checkpoint). The
finished runs were timed under the same load (``jobs`` runs sharing the machine), so the total
divided by ``jobs`` approximates the wall time left.

A new sweep (a paper's table after its validation sweep) has no finished run of its own; with
``--times-from FOLDER`` the finished runs under other folders are the last resort: a run of the
same algorithm there, per round, times this run's rounds, times how much longer this sweep's runs
have taken than those of the same algorithms there (1 until it has finished one: the validation
runs' held-out samples make them a little faster than the test runs). A run with nothing to go by
has no estimate.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, geometric_mean

from fedtail.errors import FedtailError
from fedtail.sweep.spec import PlannedRun
from fedtail.sweep.status import RunStatus

TAIL_BYTES = 1 << 20  # a metrics.jsonl record is a few kB; its last megabyte holds the last record


@dataclass(frozen=True)
class Estimate:
    minutes: dict[Path, float | None]  # per run folder: done -> its wall time; unfinished -> time left
    left: float  # minutes of the unfinished runs that have an estimate
    unknown: int  # unfinished runs without one
    borrowed: int = 0  # unfinished runs estimated only from the runs of other folders (--times-from)

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
    """Wall minutes of finished runs and the guess for a run from the runs most like it.

    Closest first: same method and setting; same method elsewhere, times the setting's factor; same
    algorithm and setting; same algorithm elsewhere, times the factor. A sweep adds each run it
    finishes, so its guesses for the later runs improve as it goes.
    """

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, str, float, int]] = []  # (method, setting, algorithm, minutes, rounds)
        self.others: list[tuple[str, float]] = []  # runs of other folders: (algorithm, minutes per round)
        self.lock = threading.Lock()

    def add(self, run: PlannedRun, minutes: float) -> None:
        with self.lock:
            self.runs.append((run.method, run.setting, run.config.algorithm, minutes, max(run.config.rounds, 1)))

    def add_other(self, algorithm: str, minutes: float, rounds: int) -> None:
        """A finished run of another folder (``--times-from``): the last resort of ``expect``."""
        with self.lock:
            self.others.append((algorithm, minutes / max(rounds, 1)))

    def _mean(self, *, setting: str | None = None, besides: str | None = None, **match: str) -> float | None:
        """Mean minutes of the runs with these fields, in ``setting`` or in any setting but ``besides``."""
        values = [
            minutes
            for method, where, algorithm, minutes, _ in self.runs
            if (setting is None or where == setting)
            and where != besides
            and all({"method": method, "algorithm": algorithm}[k] == v for k, v in match.items())
        ]
        return fmean(values) if values else None

    def setting_factor(self, setting: str) -> float:
        """How many times longer runs took in ``setting`` than the same methods in other settings.

        The geometric mean over the methods timed both in ``setting`` and elsewhere; 1 when none is.
        """
        ratios = []
        for method in {m for m, where, *_ in self.runs if where == setting}:
            here = self._mean(method=method, setting=setting)
            elsewhere = self._mean(method=method, besides=setting)
            if here and elsewhere:  # positive: a zero wall time has no ratio
                ratios.append(here / elsewhere)
        return geometric_mean(ratios) if ratios else 1.0

    def others_factor(self) -> float:
        """How many times longer this sweep's runs took per round than the other folders' runs.

        The geometric mean over the algorithms timed in both; 1 when none is.
        """
        ratios = []
        for algorithm in {a for _, _, a, _, _ in self.runs}:
            here = [m / rounds for _, _, a, m, rounds in self.runs if a == algorithm]
            there = [m for a, m in self.others if a == algorithm]
            if there and fmean(there) > 0 and fmean(here) > 0:
                ratios.append(fmean(here) / fmean(there))
        return geometric_mean(ratios) if ratios else 1.0

    def guess(self, run: PlannedRun) -> tuple[float, bool] | None:
        """Expected wall minutes of the whole run and whether only other folders' runs gave it; None
        when no finished run is like it."""
        with self.lock:
            for field, value in (("method", run.method), ("algorithm", run.config.algorithm)):
                here = self._mean(setting=run.setting, **{field: value})
                if here is not None:
                    return here, False
                elsewhere = self._mean(besides=run.setting, **{field: value})
                if elsewhere is not None:
                    return elsewhere * self.setting_factor(run.setting), False
            there = [m for a, m in self.others if a == run.config.algorithm]
            if there:
                return fmean(there) * run.config.rounds * self.others_factor(), True
            return None

    def expect(self, run: PlannedRun) -> float | None:
        """Expected wall minutes of the whole run, or None when no finished run is like it."""
        guessed = self.guess(run)
        return None if guessed is None else guessed[0]


def borrow(times: WallTimes, folders: list[Path]) -> int:
    """Add the finished runs under ``folders`` (searched recursively) to ``times``' last resort.

    Returns how many were added; raises FedtailError for a folder that does not exist or holds no
    finished run with a wall time (a typo would otherwise leave the estimate silently unchanged).
    """
    total = 0
    for folder in folders:
        if not folder.is_dir():
            raise FedtailError(f"--times-from {folder}: not a folder")
        found = 0
        for path in sorted(folder.rglob("summary.json")):
            try:
                summary = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(summary, dict) or summary.get("status", "finished") != "finished":
                continue
            minutes, rounds = wall_minutes(path.parent), summary.get("rounds")
            algorithm = summary.get("algorithm")
            if minutes is None or not isinstance(rounds, int) or rounds < 1 or not isinstance(algorithm, str):
                continue
            times.add_other(algorithm, minutes, rounds)
            found += 1
        if not found:
            raise FedtailError(f"--times-from {folder}: no finished run with a wall time (summary.json) under it")
        total += found
    return total


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
    """Minutes per run (done: measured; pending, partial or busy: expected remaining) and the total left.

    The guesses come from ``times``, by default the finished runs among ``statuses``; only the
    ``selected`` unfinished runs (all by default) count towards the time left.
    """
    minutes = measured(statuses)
    times = learned(statuses, minutes) if times is None else times
    left, unknown, borrowed = 0.0, 0, 0
    for st in statuses:
        if st.state not in ("pending", "partial", "busy") or (selected is not None and st.run.dir not in selected):
            continue
        guessed = times.guess(st.run)
        if guessed is None:
            minutes[st.run.dir] = None
            unknown += 1
            continue
        whole, other = guessed
        borrowed += other
        done = {"busy": rounds_done(st.run.dir), "partial": st.rounds_done}.get(st.state, 0)
        share = max(0.0, 1 - done / max(st.run.config.rounds, 1))
        minutes[st.run.dir] = whole * share
        left += whole * share
    return Estimate(minutes, left, unknown, borrowed)


def describe(est: Estimate, jobs: int) -> str:
    """``about 12.3 h of runs left (6.2 h at 2 in parallel)``, with the runs nothing is known of."""
    if est.left == 0 and est.unknown == 0:
        return "nothing left to run"
    if est.left == 0:  # only runs nothing is known of: "0.0 h" would read as "done"
        return f"no estimate: {est.unknown} run(s) left, none with a finished run of their method or algorithm yet"
    text = f"about {est.left / 60:.1f} h of runs left ({est.wall_hours(jobs):.1f} h at {jobs} in parallel)"
    if est.borrowed:
        text += f"; {est.borrowed} run(s) estimated from the runs of --times-from folders"
    if est.unknown:
        text += f"; {est.unknown} run(s) not estimated (no finished run of their method or algorithm yet)"
    return text
