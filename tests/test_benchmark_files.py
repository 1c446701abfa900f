"""The committed benchmark files stay valid as the library changes: every sweep file plans and every
paper-reference file loads (a broken file would otherwise surface only hours into a session)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedtail.report.tables import load_reference
from fedtail.sweep.spec import load_sweep

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
FILES = sorted(BENCHMARKS.glob("*/*.toml"))


def test_there_are_benchmark_files():
    assert len(FILES) >= 20


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_benchmark_file_loads(path: Path):
    data = tomllib.loads(path.read_text())
    if "out" in data:  # a sweep file
        sweep = load_sweep(path)
        assert sweep.runs, f"{path}: plans no runs"
        assert all(run.dir.is_relative_to(sweep.out) for run in sweep.runs)
    else:  # the paper's numbers for `fedtail report --reference`
        assert "reference" in data or "stages" in data, f"{path}: neither a sweep nor a reference file"
        load_reference(path)
