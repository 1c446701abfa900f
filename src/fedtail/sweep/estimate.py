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
have taken than those of the same algorithms, alike, there (1 until it has finished one: the validation
runs' held-out samples make them a little faster than the test runs). A run with nothing to go by
has no estimate.

One machine kind can come with and without AVX-512, and convolution-heavy runs take up to twice
as long without it (``fedtail.machine``). So each finished run's minutes are scaled to this
machine's instruction set by how much longer the runs of the same algorithm and settings took on
the run's set than here, where both have been timed; a run whose set is unknown, or that ran in
pieces on different sets, or whose set has no such pair yet, counts as it is.

Runs of one algorithm can differ in cost many times over: FedBABU fine-tuning 320 epochs at each
evaluation does 64 times the fine-tuning work of 5 epochs. So wherever a guess comes
from runs of the same algorithm (here or in other folders), the runs that also share the
run's cost-deciding settings (:func:`cost_key`: the algorithm's options, model, local training and
evaluation schedule) are preferred; a guess only from runs with other such settings is still made
but counted as rough, and :func:`describe` says how many runs have one.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, geometric_mean
from typing import Any, NamedTuple

from fedtail.errors import FedtailError
from fedtail.machine import current_capability, run_capability
from fedtail.report.runfiles import read_record
from fedtail.sweep.spec import PlannedRun
from fedtail.sweep.status import RunStatus

TAIL_BYTES = 1 << 20  # a metrics.jsonl record is a few kB; its last megabyte holds the last record


@dataclass(frozen=True)
class Estimate:
    minutes: dict[Path, float | None]  # per run folder: done -> its wall time; unfinished -> time left
    left: float  # minutes of the unfinished runs that have an estimate
    unknown: int  # unfinished runs without one
    borrowed: int = 0  # unfinished runs estimated only from the runs of other folders (--times-from)
    # unfinished runs estimated only from runs of their algorithm with other cost_key settings
    rough: frozenset[Path] = frozenset()

    def wall_hours(self, jobs: int) -> float:
        return self.left / 60 / max(jobs, 1)


class Timed(NamedTuple):
    minutes: float | None  # wall minutes of the whole run
    capability: str | None  # the instruction set it ran on ("AVX2, then AVX512": pieces on two)


def timed(run_dir: Path) -> Timed:
    """A finished run's wall time and instruction set from its ``summary.json`` (None where unknown)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return Timed(None, None)
    if not isinstance(summary, dict):
        return Timed(None, None)
    value = summary.get("wall_time_s")
    minutes = value / 60 if isinstance(value, (int, float)) and value >= 0 else None
    return Timed(minutes, run_capability(summary))


def wall_minutes(run_dir: Path) -> float | None:
    """A finished run's wall time from its ``summary.json``, or None."""
    return timed(run_dir).minutes


def rounds_done(run_dir: Path) -> int:
    """The last round recorded in a run's ``metrics.jsonl`` (0 if none)."""
    path = run_dir / "metrics.jsonl"
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - TAIL_BYTES))
            lines = fh.read().splitlines()
    except OSError:
        packed = read_record(run_dir, "metrics.jsonl")  # a finished run stored compressed
        if packed is None:
            return 0
        lines = packed.encode().splitlines()
    for line in reversed(lines):
        try:
            value = json.loads(line).get("round")
        except (ValueError, AttributeError):
            continue  # a line cut by the seek, or one being written
        if isinstance(value, int):
            return value
    return 0


def cost_key(config: dict[str, Any]) -> str:
    """The settings, besides the partition, that decide a run's time per round (``config.json``'s form).

    The algorithm's options (fine-tuning epochs, extra passes), the model, the local training
    (epochs, steps, batch size) and the evaluation schedule. Seeds, workers and checkpoints
    are left out: they do not change the work done.
    """
    train = config.get("train") or {}
    picked = {
        "options": config.get("options"),
        "model": config.get("model"),
        "train": {k: train.get(k) for k in ("local_epochs", "local_steps", "batch_size")},
        "eval": {k: config.get(k) for k in ("eval_every", "eval_final", "eval_global", "eval_split")},
    }
    return json.dumps(picked, sort_keys=True, default=str)


class Guess(NamedTuple):
    minutes: float  # expected wall minutes of the whole run
    borrowed: bool  # only the runs of other folders (--times-from) gave it
    rough: bool  # only runs of the same algorithm with other cost_key settings gave it


class WallTimes:
    """Wall minutes of finished runs and the guess for a run from the runs most like it.

    Closest first: same method and setting; same method elsewhere, times the setting's factor; same
    algorithm and setting; same algorithm elsewhere, times the factor. A sweep adds each run it
    finishes, so its guesses for the later runs improve as it goes.
    """

    def __init__(self, capability: str | None = None) -> None:
        # (method, setting, algorithm, cost_key, minutes, rounds, instruction set or None)
        self.runs: list[tuple[str, str, str, str, float, int, str | None]] = []
        # runs of other folders: (algorithm, cost_key or None when unknown, minutes per round)
        self.others: list[tuple[str, str | None, float]] = []
        self.here = capability if capability is not None else current_capability()
        self._scaled_runs: list[tuple[str, str, str, str, float, int]] | None = None  # of the runs added so far
        self.lock = threading.Lock()

    def add(self, run: PlannedRun, minutes: float, capability: str | None = None) -> None:
        """A finished run; ``capability``: the instruction set it ran on (None: unknown)."""
        key = cost_key(run.config_dict())
        with self.lock:
            self.runs.append(
                (run.method, run.setting, run.config.algorithm, key, minutes, max(run.config.rounds, 1), capability)
            )
            self._scaled_runs = None

    def _speed_factors(self) -> dict[str, float]:
        """Per other instruction set, how many times longer runs took there than here: the geometric
        mean over the (algorithm, cost_key) pairs timed on both, per round."""
        per_round: dict[tuple[str, str, str], list[float]] = {}
        for _, _, algorithm, key, minutes, rounds, cap in self.runs:
            if cap is not None and ", then " not in cap:
                per_round.setdefault((algorithm, key, cap), []).append(minutes / rounds)
        ratios: dict[str, list[float]] = {}
        for (algorithm, key, cap), there in per_round.items():
            here = per_round.get((algorithm, key, self.here)) if self.here else None
            if cap != self.here and here and fmean(here) > 0 and fmean(there) > 0:
                ratios.setdefault(cap, []).append(fmean(there) / fmean(here))
        return {cap: geometric_mean(r) for cap, r in ratios.items()}

    def _scaled(self) -> list[tuple[str, str, str, str, float, int]]:
        """The runs with their minutes as this machine would take them, where that is known."""
        if self._scaled_runs is None:
            factors = self._speed_factors()
            self._scaled_runs = [
                (m, s, a, k, minutes / factors.get(cap or "", 1.0), r) for m, s, a, k, minutes, r, cap in self.runs
            ]
        return self._scaled_runs

    def add_other(self, algorithm: str, minutes: float, rounds: int, key: str | None = None) -> None:
        """A finished run of another folder (``--times-from``): the last resort of ``expect``."""
        with self.lock:
            self.others.append((algorithm, key, minutes / max(rounds, 1)))

    def _mean(self, *, setting: str | None = None, besides: str | None = None, **match: str) -> float | None:
        """Mean minutes of the runs with these fields (method, algorithm, key), in ``setting`` or in
        any setting but ``besides``."""
        values = [
            minutes
            for method, where, algorithm, key, minutes, _ in self._scaled()
            if (setting is None or where == setting)
            and where != besides
            and all({"method": method, "algorithm": algorithm, "key": key}[k] == v for k, v in match.items())
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
        """How many times longer this sweep's runs took per round than the other folders' alike runs.

        The geometric mean over the algorithms timed in both with the same :func:`cost_key` (or
        one unknown there); 1 when none is.
        """
        ratios = []
        scaled = self._scaled()
        for algorithm, key in {(a, k) for _, _, a, k, _, _ in scaled}:
            here = [m / rounds for _, _, a, k, m, rounds in scaled if (a, k) == (algorithm, key)]
            there = [m for a, k, m in self.others if a == algorithm and k in (None, key)]
            if there and fmean(there) > 0 and fmean(here) > 0:
                ratios.append(fmean(here) / fmean(there))
        return geometric_mean(ratios) if ratios else 1.0

    def guess(self, run: PlannedRun) -> Guess | None:
        """The expected wall minutes of the whole run and where they come from; None when no
        finished run is like it.

        Closest first: the method's runs (they share its settings); the algorithm's runs with the
        same :func:`cost_key`, here, then in other folders; then, roughly, any of the algorithm's runs.
        """
        key = cost_key(run.config_dict())
        algorithm = run.config.algorithm
        with self.lock:
            for match, rough in (({"method": run.method}, False), ({"algorithm": algorithm, "key": key}, False)):
                if (here := self._here_or_elsewhere(run.setting, **match)) is not None:
                    return Guess(here, False, rough)
            there = [(k, m) for a, k, m in self.others if a == algorithm]
            alike = [m for k, m in there if k is None or k == key]  # unknown settings: no reason to call it rough
            if alike:
                return Guess(fmean(alike) * run.config.rounds * self.others_factor(), True, False)
            if (here := self._here_or_elsewhere(run.setting, algorithm=algorithm)) is not None:
                return Guess(here, False, True)
            if there:
                return Guess(fmean(m for _, m in there) * run.config.rounds * self.others_factor(), True, True)
            return None

    def _here_or_elsewhere(self, setting: str, **match: str) -> float | None:
        """Mean minutes of the matching runs in ``setting``, else in the others times the setting's factor."""
        here = self._mean(setting=setting, **match)
        if here is not None:
            return here
        elsewhere = self._mean(besides=setting, **match)
        return None if elsewhere is None else elsewhere * self.setting_factor(setting)

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
            times.add_other(algorithm, minutes, rounds, other_key(path.parent))
            found += 1
        if not found:
            raise FedtailError(f"--times-from {folder}: no finished run with a wall time (summary.json) under it")
        total += found
    return total


def other_key(run_dir: Path) -> str | None:
    """:func:`cost_key` of a finished run from its ``config.json``; None when that is missing or unreadable."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cost_key(config) if isinstance(config, dict) else None


def measured(statuses: list[RunStatus]) -> dict[Path, Timed]:
    """The wall minutes and instruction sets of the finished runs among ``statuses``."""
    return {st.run.dir: timed(st.run.dir) for st in statuses if st.state == "done"}


def learned(
    statuses: list[RunStatus], found: dict[Path, Timed] | None = None, capability: str | None = None
) -> WallTimes:
    """The wall times of the finished runs among ``statuses`` (``found``: already read), to be
    scaled to ``capability`` (default: this machine's instruction set)."""
    found = measured(statuses) if found is None else found
    times = WallTimes(capability)
    for st in statuses:
        t = found.get(st.run.dir)
        if t is not None and t.minutes is not None:
            times.add(st.run, t.minutes, t.capability)
    return times


def estimate(
    statuses: list[RunStatus], selected: set[Path] | None = None, times: WallTimes | None = None
) -> Estimate:
    """Minutes per run (done: measured; pending, partial or busy: expected remaining) and the total left.

    The guesses come from ``times``, by default the finished runs among ``statuses``; only the
    ``selected`` unfinished runs (all by default) count towards the time left.
    """
    found = measured(statuses)
    times = learned(statuses, found) if times is None else times
    minutes: dict[Path, float | None] = {d: t.minutes for d, t in found.items()}
    left, unknown, borrowed, rough = 0.0, 0, 0, set()
    for st in statuses:
        if st.state not in ("pending", "partial", "busy") or (selected is not None and st.run.dir not in selected):
            continue
        guessed = times.guess(st.run)
        if guessed is None:
            minutes[st.run.dir] = None
            unknown += 1
            continue
        whole = guessed.minutes
        borrowed += guessed.borrowed
        if guessed.rough:
            rough.add(st.run.dir)
        done = {"busy": rounds_done(st.run.dir), "partial": st.rounds_done}.get(st.state, 0)
        share = max(0.0, 1 - done / max(st.run.config.rounds, 1))
        minutes[st.run.dir] = whole * share
        left += whole * share
    return Estimate(minutes, left, unknown, borrowed, frozenset(rough))


def describe(est: Estimate, jobs: int) -> str:
    """``about 12.3 h of runs left (6.2 h at 2 in parallel)``, with the runs nothing is known of."""
    if est.left == 0 and est.unknown == 0:
        return "nothing left to run"
    if est.left == 0:  # only runs nothing is known of: "0.0 h" would read as "done"
        return f"no estimate: {est.unknown} run(s) left, none with a finished run of their method or algorithm yet"
    text = f"about {est.left / 60:.1f} h of runs left ({est.wall_hours(jobs):.1f} h at {jobs} in parallel)"
    if est.borrowed:
        text += f"; {est.borrowed} run(s) estimated from the runs of --times-from folders"
    if est.rough:
        text += (
            f"; {len(est.rough)} run(s) estimated roughly (~N?), from runs of their algorithm with other options, model, local"
            " training or evaluation schedule (these can change a run's time many times over)"
        )
    if est.unknown:
        text += f"; {est.unknown} run(s) not estimated (no finished run of their method or algorithm yet)"
    return text
