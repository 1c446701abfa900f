"""The repository itself: what is committed stays small enough to clone and review.

Run folders are committed when they finish; an unfinished one beside them holds a checkpoint of
tens of MB that must never be committed (a finished run deletes its own).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1_000_000  # bytes: the project's limit for one committed file


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_committed_file_is_over_the_limit():
    files = tracked_files()
    assert files, "git ls-files listed nothing"
    big = sorted(
        (str(p.relative_to(ROOT)), p.stat().st_size) for p in files if p.is_file() and p.stat().st_size > LIMIT
    )
    assert not big, f"committed files over {LIMIT} bytes: {big}"


def test_no_checkpoint_is_committed():
    names = [str(p.relative_to(ROOT)) for p in tracked_files() if p.name in ("checkpoint.pt", "checkpoint.json")]
    assert not names, f"checkpoints of unfinished runs are committed: {names}"


def test_committed_runs_store_their_records_compressed():
    """The checkout stays light (issue 68): a committed run folder holds metrics.jsonl.gz and
    partition.json.gz (fedtail sweep --compress, fedtail runs ROOT --compress), not the plain files."""
    files = tracked_files()
    plain = sorted(str(p.relative_to(ROOT)) for p in files
                   if p.name in ("metrics.jsonl", "partition.json") and "benchmarks" in p.parts)  # fmt: skip
    assert not plain, f"commit these compressed (fedtail runs DIR --compress): {plain[:5]} ({len(plain)} in all)"
    runs = sum(1 for p in files if p.name == "metrics.jsonl.gz")
    assert runs > 100  # the benchmark runs are there, compressed
