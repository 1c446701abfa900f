"""Which code made a run: the package version and, for a git checkout, the commit of its sources.

A sweep may run for days while the library keeps changing: each run process imports whatever the
source tree holds when it starts (and again when it resumes from a checkpoint). The config alone
cannot tell two such runs apart, so every run's ``summary.json`` names the code of the process that
finished it, and ``run.log`` names the code of every piece of a resumed run.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return done.stdout if done.returncode == 0 else None


@lru_cache(maxsize=1)
def code_info() -> dict[str, Any]:
    """``{"fedtail": version, "commit": sha or None, "modified": bool or None}``.

    ``commit`` is the HEAD of the git checkout holding the package (None for an installed copy);
    ``modified`` says whether the package's sources differ from that commit (uncommitted edits or
    new files under the package directory; None when unknown). Computed once per process: the
    code a process runs is the code it imported at its start.
    """
    from fedtail import __version__

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".") if commit else None
    return {
        "fedtail": __version__,
        "commit": commit.strip() if commit else None,
        "modified": None if status is None else bool(status.strip()),
    }


def describe_code(info: dict[str, Any]) -> str:
    """One line: ``fedtail 0.1.0, commit 1a2b3c4d5e6f (sources modified)``."""
    text = f"fedtail {info.get('fedtail', '?')}"
    commit = info.get("commit")
    if commit:
        text += f", commit {commit[:12]}"
        if info.get("modified"):
            text += " (sources modified since)"
    else:
        text += ", not a git checkout"
    return text
