"""Running planned runs, each in its own process, at most ``jobs`` at a time.

A run executes as ``python -m fedtail.sweep.runone DIR`` with its config on stdin and its
output in ``DIR/run.log``, so one crashing run does not stop the others. A *partial* run
(stopped after a checkpoint) keeps its folder and resumes; its log goes on in the same file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedtail.report.runfiles import checkpoint_info, config_diff, is_finished
from fedtail.sweep.estimate import WallTimes
from fedtail.sweep.spec import PlannedRun, Sweep
from fedtail.sweep.status import PidLock, busy_dirs, claim_path, diverged_note, run_status

LOG_NAME = "run.log"
EXIT_DIVERGED = 3  # runone's exit code of a diverged run
RUNONE = "fedtail.sweep.runone"


@dataclass
class RunOutcome:
    run: PlannedRun
    ok: bool
    minutes: float
    summary: dict[str, Any] | None = None
    error: str = ""
    # why the run was not started (another sweep has it, or finished it: then ``summary`` is that
    # run's); not a failure
    skipped: str = ""
    # why the run was left for a later sweep: it would not end within the time limit; not a failure
    deferred: str = ""
    # where and why the run diverged (its summary says so); ``ok`` is False
    diverged: str = ""


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or "(empty log)"


class Runner:
    """Runs planned runs in subprocesses, at most ``jobs`` at a time.

    Each run is claimed (:class:`~fedtail.sweep.status.PidLock` on ``.seed{k}.claim``) and its
    folder checked again just before it starts, because another sweep sharing the output folder
    may have started or finished it since this sweep made its plan.

    With a ``deadline`` (a :func:`time.monotonic` value), a run whose expected wall time
    (``times``, which learns from each run finished here) would take it past the deadline is
    deferred, and the next one in order that fits is started instead; a run nothing is known of
    starts while the deadline has not passed.
    """

    def __init__(
        self,
        jobs: int,
        force: bool = False,
        deadline: float | None = None,
        times: WallTimes | None = None,
        rerun_diverged: bool = False,
        experiment: str | None = None,
    ) -> None:
        self.jobs = jobs
        self.experiment = experiment  # what a run's tracking calls the sweep (--log mlflow's experiment)
        self.force = force
        self.rerun_diverged = rerun_diverged
        self.deadline = deadline
        self.times = WallTimes() if times is None else times
        self.procs: dict[Path, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def _env(self, run: PlannedRun | None = None) -> dict[str, str]:
        from fedtail.tracking import EXPERIMENT_ENV, RUN_NAME_ENV

        env = dict(os.environ)
        env.pop("FEDTAIL_PROGRESS", None)  # the child's output goes to a log file
        if self.experiment is not None:
            env[EXPERIMENT_ENV] = self.experiment
        if run is not None:
            env[RUN_NAME_ENV] = run.label
        return env

    def run_one(self, run: PlannedRun) -> RunOutcome:
        if self.stopped.is_set():
            return RunOutcome(run, False, 0.0, error="not started (sweep interrupted)")
        late = self._too_late(run)
        if late:
            return RunOutcome(run, False, 0.0, deferred=late)
        claim = PidLock(claim_path(run))
        holder = claim.try_acquire()
        if holder is not None:
            return RunOutcome(run, False, 0.0, skipped=f"another fedtail sweep (pid {holder}) is running it")
        try:
            st = run_status(run, busy_dirs())
            if st.state == "done":
                try:
                    summary = json.loads((run.dir / "summary.json").read_text())
                except (OSError, ValueError):
                    summary = None
                return RunOutcome(run, False, 0.0, summary, skipped="finished by another sweep meanwhile")
            if st.state == "diverged" and not self.rerun_diverged:
                return RunOutcome(run, False, 0.0, skipped=f"diverged by another sweep meanwhile: {st.note}")
            if st.state == "busy" or (st.state == "stale" and not self.force):
                return RunOutcome(run, False, 0.0, skipped=f"{st.state} when its turn came: {st.note}")
            outcome = self._execute(run, resume=st.state == "partial")
            if outcome.ok:
                self.times.add(run, outcome.minutes, self.times.here)  # it ran on this machine
            return outcome
        finally:
            claim.release()

    def _too_late(self, run: PlannedRun) -> str:
        """Why ``run`` must wait for a later sweep ("" when it may start now)."""
        if self.deadline is None:
            return ""
        left = (self.deadline - time.monotonic()) / 60
        if left <= 0:
            return "the time limit has passed"
        expected = self.times.expect(run)
        if expected is not None:
            expected *= 1 - checkpointed_rounds(run) / max(run.config.rounds, 1)  # a partial run's rest
        if expected is not None and expected > left:
            return f"expected to take ~{expected:.0f} min, {left:.0f} min left of the time limit"
        return ""

    def _execute(self, run: PlannedRun, resume: bool = False) -> RunOutcome:
        """Run ``run`` in a subprocess; ``resume``: keep the folder, whose checkpoint the run resumes from."""
        start = time.perf_counter()
        if run.dir.exists() and not resume:
            shutil.rmtree(run.dir)
        run.dir.mkdir(parents=True, exist_ok=True)
        log = run.dir / LOG_NAME
        with open(log, "a" if resume else "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", RUNONE, str(run.dir)],
                stdin=subprocess.PIPE,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self._env(run),
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
        if proc.returncode in (0, EXIT_DIVERGED):
            try:
                summary = json.loads((run.dir / "summary.json").read_text())
            except (OSError, ValueError):
                summary = None
        if proc.returncode == EXIT_DIVERGED and summary is not None:
            return RunOutcome(run, False, minutes, summary, diverged=diverged_note(run.dir))
        if summary is None:
            return RunOutcome(run, False, minutes, error=f"exit code {proc.returncode}\n" + tail(log))
        wall = summary.get("wall_time_s")
        if isinstance(wall, (int, float)):
            # the run's own time: the part before a checkpoint in, the seconds it stood stopped out
            # (engine/clock.py); the process's wall clock would count a `kill -STOP` pause
            minutes = wall / 60
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
        """Run ``runs`` (started in list order); ``on_done`` sees each outcome as it finishes.

        Returns the outcomes in list order. On an exception (Ctrl-C) the runs are stopped.
        """
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


def checkpointed_rounds(run: PlannedRun) -> int:
    """The round of the checkpoint ``run`` would resume from (0 if none, or one of another config)."""
    info = checkpoint_info(run.dir)
    if info is None or is_finished(run.dir) or config_diff(info["config"], run.config_dict()):
        return 0
    return info["round"]


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
