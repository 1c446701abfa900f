"""The run folders on disk: done, partial, pending, stale or busy; and the claim of a run being run.

A folder whose ``summary.json`` exists and whose ``config.json`` equals the planned config
(ignoring :data:`IGNORED_KEYS`) is *done*, or *diverged* when that summary says the run diverged
(rerun only with ``--rerun-diverged``); a finished folder with another config is *stale*;
an unfinished folder named on the command line of a live process is *busy*; an unfinished
folder with a checkpoint of the planned config is *partial* (resumed from the checkpoint);
anything else is *pending* (cleared and rerun).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fedtail.errors import ConfigError
from fedtail.report.runfiles import IGNORED_KEYS, checkpoint_info, config_diff  # noqa: F401 (IGNORED_KEYS: re-exported)
from fedtail.sweep.spec import PlannedRun, Sweep

try:
    import fcntl
except ImportError:  # not POSIX: sweeps sharing a folder are not serialised
    fcntl = None  # type: ignore[assignment]

STATES = ("done", "pending", "stale", "busy", "partial", "diverged")


@dataclass(frozen=True)
class RunStatus:
    run: PlannedRun
    state: str  # done | diverged | partial | pending | stale | busy
    note: str = ""
    diffs: tuple[str, ...] = ()
    rounds_done: int = 0  # partial: the round of the checkpoint it resumes from


def now() -> str:
    """The local time with its UTC offset, to the second (ISO 8601)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


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
    """done, partial (checkpointed), pending, stale, or busy (unfinished and named by a live process: left alone)."""
    d = run.dir
    if (d / "summary.json").is_file():
        try:
            existing = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            return RunStatus(run, "stale", "finished, but config.json is missing or unreadable")
        diffs = tuple(config_diff(existing, run.config_dict()))
        if diffs:
            return RunStatus(run, "stale", "finished with a different config: " + "; ".join(diffs), diffs)
        diverged = diverged_note(d)
        return RunStatus(run, "diverged", diverged) if diverged else RunStatus(run, "done")
    if d.is_dir() and any(d.iterdir()):
        if d.resolve() in busy:
            return RunStatus(run, "busy", "in use by a running process; left alone")
        failed = d / "FAILED"
        why = failed.read_text().strip().splitlines()[0] if failed.is_file() else "no summary.json"
        info = checkpoint_info(d)
        if info is not None:
            diffs = config_diff(info["config"], run.config_dict())
            if not diffs:
                done, total = info["round"], info.get("rounds", run.config.rounds)
                note = f"checkpoint after round {done}/{total}; it resumes there"
                return RunStatus(run, "partial", note, rounds_done=done)
            why += "; its checkpoint is of another config: " + "; ".join(diffs)
        return RunStatus(run, "pending", f"unfinished folder ({why}); it will be cleared")
    return RunStatus(run, "pending")


def diverged_note(run_dir: Path) -> str:
    """"diverged at round R: cause" when the folder's summary says the run diverged, else ""."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(summary, dict) or summary.get("status") != "diverged":
        return ""
    info = summary.get("diverged") or {}
    return f"diverged at round {info.get('round', '?')}: {info.get('cause', '?')}"


def check_stale(statuses: list[RunStatus], force: bool) -> None:
    stale = [s for s in statuses if s.state == "stale"]
    if stale and not force:
        lines = [f"{s.run.dir}: {s.note}" for s in stale]
        raise ConfigError(
            f"{len(stale)} finished run folder(s) hold a different config; pass --supersede TAG to keep "
            "them under superseded/TAG and rerun them, --force to rerun them in place (their results are "
            "replaced), or change `out`:\n  " + "\n  ".join(lines)
        )


def superseded_dir(sweep: Sweep, run_dir: Path, tag: str) -> Path:
    """Where ``--supersede TAG`` keeps a stale folder: ``{out}/../superseded/TAG/{out name}/...``."""
    out = sweep.out.resolve()  # `--out .` or `..` would otherwise nest it in `out` or drop the tag
    return out.parent / "superseded" / tag / out.name / run_dir.resolve().relative_to(out)


def supersede(statuses: list[RunStatus], sweep: Sweep, tag: str, move: bool = True) -> list[tuple[Path, Path]]:
    """Move the selected stale (finished, other config) folders out of the sweep's way, kept whole
    under :func:`superseded_dir`; returns ``(from, to)`` pairs. Nothing moves if any target exists."""
    if not tag or "/" in tag or tag in (".", ".."):
        raise ConfigError(f"--supersede {tag!r}: give a folder name, e.g. a date or what changed")
    selected = sweep.selected_dirs()
    moves = [(s.run.dir, superseded_dir(sweep, s.run.dir, tag)) for s in statuses if s.state == "stale" and s.run.dir in selected]
    taken = [str(dst) for _, dst in moves if dst.exists()]
    if taken:
        raise ConfigError("--supersede: these folders exist already; choose another tag:\n  " + "\n  ".join(taken))
    if move:
        for src, dst in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
    return moves


def count(statuses: list[RunStatus], sweep: Sweep) -> dict[str, int]:
    """How many selected runs are in each state."""
    selected = sweep.selected_dirs()
    out = dict.fromkeys(STATES, 0)
    for st in statuses:
        if st.run.dir in selected:
            out[st.state] += 1
    return out


def to_run(statuses: list[RunStatus], sweep: Sweep, force: bool, rerun_diverged: bool = False) -> list[PlannedRun]:
    """The selected runs to execute, in plan order: partial and pending ones and, with ``force``,
    stale ones; with ``rerun_diverged``, diverged ones."""
    selected = sweep.selected_dirs()
    wanted = {"partial", "pending"} | ({"stale"} if force else set()) | ({"diverged"} if rerun_diverged else set())
    return [st.run for st in statuses if st.run.dir in selected and st.state in wanted]


@contextlib.contextmanager
def folder_lock(folder: Path):
    """An exclusive ``flock`` on the folder itself, for a short critical section (released
    when the process dies). Threads of one process exclude each other too: each opens its own fd."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class PidLock:
    """A file created exclusively that holds its owner's pid; the file of a dead owner is taken over.

    Used as ``DIR.claim`` beside each run folder while a sweep runs it (:func:`claim_path`), so
    several sweeps (of one file or of several) can share an output folder without running a
    run twice. Same host only: a lock written on another host is never taken over.

    Acquiring (read, take over, create and write) runs under :func:`folder_lock` on the claim's
    folder: otherwise a sweep could read a claim another had created but not yet written, take
    it for the garbage of a dead process and run the same run (seen with two sweeps under load).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = False

    def try_acquire(self) -> int | None:
        """None when acquired, else the pid of the live process holding the lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(self.path.parent):
            return self._acquire()

    def _acquire(self) -> int | None:
        host = os.uname().nodename if hasattr(os, "uname") else ""
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    other = json.loads(self.path.read_text())
                    pid, other_host = int(other["pid"]), other.get("host", "")
                except (OSError, ValueError, KeyError, TypeError):
                    pid, other_host = -1, host  # half-written or garbage: treated as dead
                if pid > 0 and (other_host != host or _alive(pid)):
                    return pid
                self.path.unlink(missing_ok=True)  # left by a dead process
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"pid": os.getpid(), "host": host, "started": now()}, fh)
            self.held = True
            return None
        raise ConfigError(f"could not create {self.path}")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def claim_path(run: PlannedRun) -> Path:
    """``{setting}/{method}/.seed{k}.claim``: exists while a sweep runs that run."""
    return run.dir.with_name(f".{run.dir.name}.claim")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
