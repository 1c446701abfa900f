"""The console side of ``fedtail sweep``: the plan table, the progress bar, one line per run.

Parsing, folder status, the lock, ``sweep.json`` and the subprocesses are :mod:`fedtail.sweep`.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedtail.errors import ConfigError
from fedtail.report.runfiles import compress_records
from fedtail.sweep import (
    RunOutcome,
    Runner,
    RunStatus,
    Sweep,
    SweepRecord,
    busy_dirs,
    check_stale,
    count,
    load_sweep,
    oversubscription,
    run_status,
    supersede,
    to_run,
)
from fedtail.sweep.estimate import Estimate, WallTimes, borrow, describe, estimate, learned
from fedtail.sweep.record import personalized_acc, supersede_records


def parse_duration(text: str) -> float:
    """Minutes in ``90``, ``90m``, ``2h``, ``1h30m`` or ``1.5h``; ConfigError otherwise."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*(?:m|min)?)?\s*", text)
    if not text.strip() or m is None or m.group(0).strip() == "":
        raise ConfigError(f"--time-limit {text!r}: give minutes or hours, e.g. 90, 90m, 2h or 1h30m")
    hours, minutes = (float(g) if g else 0.0 for g in m.groups())
    total = 60 * hours + minutes
    if total <= 0:
        raise ConfigError(f"--time-limit {text!r}: must be more than 0 minutes")
    return total


def describe_outcome(outcome: RunOutcome) -> str:
    """One line of Rich markup per finished run."""
    where = escape(str(outcome.run.dir))
    if outcome.skipped:
        return f"[yellow]skipped[/] {where}: {escape(outcome.skipped)}"
    if outcome.deferred:
        return f"[cyan]deferred[/] {where}: {escape(outcome.deferred)}"
    if outcome.diverged:
        return f"[bold red]diverged[/] {where}: {escape(outcome.diverged)}"
    if not outcome.ok:
        return f"[red]failed[/] {where} after {outcome.minutes:.1f} min"
    s = outcome.summary or {}
    best = s.get("best", {})
    fmt = lambda v: "—" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    return (
        f"[green]done[/] {where}: final {fmt(personalized_acc(s, 'final'))}, "
        f"best {fmt(personalized_acc(s, 'best'))} (round {best.get('round', '?')}), {outcome.minutes:.1f} min"
    )


def execute(
    sweep: Sweep,
    statuses: list[RunStatus],
    *,
    jobs: int,
    command: str,
    console: Any,
    force: bool = False,
    deadline: float | None = None,
    times: WallTimes | None = None,
    rerun_diverged: bool = False,
    compress: bool = False,
) -> list[RunOutcome]:
    """Run the selected pending (and, with ``force``, stale) runs; writes ``{out}/sweep.json`` if any.

    ``deadline`` (:func:`time.monotonic`): runs expected to end later are deferred (:class:`Runner`).
    ``compress``: a run that finishes or diverges gets its records compressed (``compress_records``),
    and so does one that a stopped sweep left finished but plain (stopped before compressing it).
    """
    if compress:
        for st in statuses:
            if st.state in ("done", "diverged"):
                compress_records(st.run.dir)
    todo = to_run(statuses, sweep, force, rerun_diverged)
    if not todo:  # nothing changes: sweep.json keeps the record of the sweep that ran the runs
        return []
    record = SweepRecord(sweep, statuses, command, jobs)
    record.queue(todo)
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
    with progress:
        task = progress.add_task("runs", total=len(todo))

        def on_done(outcome: RunOutcome) -> None:
            if compress and (outcome.ok or outcome.diverged) and not outcome.skipped:  # a diverged run is final too
                compress_records(outcome.run.dir)
            record.update(outcome)
            progress.console.print(describe_outcome(outcome), highlight=False, soft_wrap=True)
            progress.advance(task)

        try:
            times = learned(statuses) if times is None else times
            outcomes = Runner(jobs, force, deadline, times, rerun_diverged, experiment=str(sweep.file)).map(todo, on_done)
        except BaseException:
            record.interrupt(todo)
            raise
    return outcomes


def minutes_cell(state: str, minutes: float | None, rough: bool = False) -> str:
    """Measured minutes of a finished run, ``~N`` expected (``~N left`` while running or
    checkpointed; ``~N?`` when only runs with other cost settings gave it), else ``?``."""
    if state == "stale":
        return ""
    if minutes is None:
        return "?"
    if state == "done":
        return f"{minutes:.1f}"
    return f"~{minutes:.0f}" + ("?" if rough else "") + (" left" if state in ("busy", "partial") else "")


def plan_table(sweep: Sweep, statuses: list[RunStatus], est: Estimate) -> tuple[Table, list[str]]:
    """A Rich table of the selected runs, in execution order, with status and minutes; and the notes.

    One line per run keeps a long plan readable: the algorithm's options are left out (they are
    in the file) and each run's note (why it is stale, busy or will be cleared) is a line under
    the table.
    """
    selected = sweep.selected_dirs()
    table = Table(title=escape(f"{sweep.file}: {len(selected)} runs -> {sweep.out}"))
    for col in ("#", "setting", "method", "seed", "algorithm", "status", "min"):
        table.add_column(col, overflow="fold", justify="right" if col == "min" else "left")
    style = {"done": "green", "diverged": "red", "partial": "cyan", "pending": "yellow", "stale": "red", "busy": "magenta"}
    notes: list[str] = []
    for i, st in enumerate((s for s in statuses if s.run.dir in selected), 1):
        run = st.run
        table.add_row(
            str(i), escape(run.setting), escape(run.method), str(run.seed), escape(run.config.algorithm),
            f"[{style[st.state]}]{st.state}[/]", minutes_cell(st.state, est.minutes.get(run.dir), run.dir in est.rough),
        )
        if st.note:
            notes.append(f"{i} {escape(run.label)}: {escape(st.note)}")
    return table, notes


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
    time_limit: str | None = None,
    rerun_diverged: bool = False,
    seeds: list[int] | None = None,
    supersede_tag: str | None = None,
    times_from: list[Path] | None = None,
    compress: bool = False,
) -> int:
    """``fedtail sweep``: 0 unless a run failed (then 1).

    Bad input (the file, a stale folder) raises ConfigError before any run starts. Other sweeps
    may share the output folder: a run another sweep has started or finished is skipped. With
    ``time_limit`` (e.g. ``2h``, counted from now) runs expected to end after it are deferred.
    ``times_from``: folders of other finished runs, the last resort of the time estimates.
    """
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1 (got {jobs})")
    if force and supersede_tag is not None:
        raise ConfigError("--force and --supersede: choose one (--force replaces stale results, --supersede keeps them)")
    limit = None if time_limit is None else parse_duration(time_limit)
    deadline = None if limit is None else time.monotonic() + 60 * limit  # counted from the start
    plan = load_sweep(file, out=out, settings=settings, methods=methods, seeds=seeds)
    n_jobs = jobs or plan.jobs
    if dry_run:
        statuses = [run_status(r, busy_dirs()) for r in plan.runs]
        times = learned(statuses)
        borrow(times, times_from or [])
        est = estimate(statuses, plan.selected_dirs(), times)
        table, notes = plan_table(plan, statuses, est)
        stdout.print(table)
        for note in notes:
            stdout.print(note, highlight=False, soft_wrap=True)
        if supersede_tag is not None:
            for src, dst in supersede(statuses, plan, supersede_tag, move=False):
                stdout.print(f"--supersede would move {src} -> {dst}", highlight=False, soft_wrap=True)
        summary = ", ".join(f"{n} {state}" for state, n in count(statuses, plan).items())
        stdout.print(f"{summary}; {describe(est, n_jobs)} (dry run: nothing was run)", soft_wrap=True)
        return 0
    argv = ["fedtail", "sweep", str(file)]
    for flag, value in (("--jobs", jobs), ("--methods", methods), ("--settings", settings), ("--seeds", seeds), ("--out", out)):
        if value is not None:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    argv += ["--force"] if force else []
    argv += ["--supersede", supersede_tag] if supersede_tag is not None else []
    argv += ["--rerun-diverged"] if rerun_diverged else []
    argv += ["--time-limit", time_limit] if time_limit is not None else []
    argv += ["--compress"] if compress else []
    for folder in times_from or []:
        argv += ["--times-from", str(folder)]
    say = lambda text: console.print(text, highlight=False, soft_wrap=True)  # noqa: E731
    busy = busy_dirs()
    statuses = [run_status(r, busy) for r in plan.runs]
    if supersede_tag is not None:
        moves = supersede(statuses, plan, supersede_tag)
        supersede_records(plan.out, moves)
        for src, dst in moves:
            say(escape(f"superseded: {src} -> {dst}"))
        statuses = [run_status(r, busy) for r in plan.runs]
    times = learned(statuses)  # read once: the header's estimate, then the time limit's guesses
    borrow(times, times_from or [])
    selected = plan.selected_dirs()
    check_stale([s for s in statuses if s.run.dir in selected], force)
    counts = count(statuses, plan)
    todo = counts["pending"] + counts["partial"] + (counts["stale"] if force else 0)
    todo += counts["diverged"] if rerun_diverged else 0
    resumed = f" ({counts['partial']} resumed from checkpoints)" if counts["partial"] else ""
    say(
        escape(
            f"sweep {file}: {len(plan.selected)} runs, {counts['done']} done, {todo} to run{resumed}, "
            f"{n_jobs} in parallel -> {plan.out}; {describe(estimate(statuses, selected, times), n_jobs)}"
        )
    )
    note = oversubscription(plan, n_jobs)
    if note:
        say(f"[yellow]warning:[/] {escape(note)}")
    if limit is not None:
        say(escape(f"time limit {limit:.0f} min: a run expected to end later is left for the next sweep"))
    for st in statuses:
        if st.state == "busy" and st.run.dir in selected:
            say(f"[yellow]warning:[/] {escape(str(st.run.dir))}: {escape(st.note)}")
    outcomes = execute(
        plan,
        statuses,
        jobs=n_jobs,
        command=shlex.join(argv),
        console=console,
        force=force,
        deadline=deadline,
        times=times,
        rerun_diverged=rerun_diverged,
        compress=compress,
    )
    diverged = [o for o in outcomes if o.diverged]
    failed = [o for o in outcomes if not o.ok and not o.skipped and not o.deferred and not o.diverged]
    for o in diverged:
        say(f"[bold red]diverged:[/] {escape(str(o.run.dir))}: {escape(o.diverged)}")
    skipped = [o for o in outcomes if o.skipped]
    deferred = [o for o in outcomes if o.deferred]
    for o in failed:
        say(f"[bold red]failed:[/] {escape(str(o.run.dir))}\n{escape(o.error)}")
    finished = len(outcomes) - len(failed) - len(skipped) - len(deferred) - len(diverged)
    also = f", {len(diverged)} diverged (rerun with --rerun-diverged)" if diverged else ""
    also += f", {len(skipped)} skipped (another sweep has them)" if skipped else ""
    also += f", {len(deferred)} deferred (would not end within the time limit)" if deferred else ""
    say(escape(f"{finished} runs finished, {len(failed)} failed{also}; plan in {plan.out / 'sweep.json'}"))
    return 1 if failed else 0
