"""The committed benchmark files stay valid as the library changes: every sweep file plans and every
paper-reference file loads (a broken file would otherwise surface only hours into a session)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedtail.report.tables import load_reference
from fedtail.sweep.spec import load_sweep
from fedtail.sweep.status import run_status

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
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
        assert {"reference", "stages", "segmentation"} & set(data), f"{path}: neither a sweep nor a reference file"
        load_reference(path)


def test_every_finished_run_is_current_against_its_sweep_file():
    """A changed default or option that a finished run did not have makes the run stale: the report
    then drops it and the next sweep runs it again. Caught here, not hours into a session: pin the
    values the runs were made with in the sweep file (where they do not act) or supersede the runs."""
    stale, checked = [], 0
    for path in FILES:
        if "out" not in tomllib.loads(path.read_text()):
            continue
        for run in load_sweep(path).runs:
            if (run.dir / "summary.json").is_file():
                checked += 1
                if (status := run_status(run)).state == "stale":
                    stale.append(f"{path.relative_to(ROOT)}: {run.dir.relative_to(ROOT)}: {status.note}")
    assert checked > 100, "the committed runs were not found"
    assert not stale, "\n".join(stale)


def test_sweep_files_that_share_a_run_folder_plan_the_same_run():
    """Tables share runs (Table I's FedAvg is Table II's, its MuPFL at fixed κ Table V's): two files
    that plan one folder with different configs would each find the other's run stale."""
    from fedtail.sweep.status import config_diff

    planned: dict[Path, tuple[Path, dict]] = {}
    clashes, shared = [], 0
    for path in FILES:
        if "out" not in tomllib.loads(path.read_text()):
            continue
        for run in load_sweep(path).runs:
            here = run.config_dict()
            key = run.dir.resolve()
            if key in planned:
                shared += 1
                first, config = planned[key]
                if diffs := list(config_diff(config, here)):
                    clashes.append(f"{run.dir}: {first.name} vs {path.name}: {'; '.join(diffs)}")
            else:
                planned[key] = (path, here)
    assert shared > 20, "the shared runs were not found"
    assert not clashes, "\n".join(clashes)


def test_papers_md_lists_every_table_and_figure_as_papers_toml_says():
    """benchmarks/PAPERS.md is papers.toml rendered, every file it names exists, every table sweep is named."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("papers", ROOT / "benchmarks" / "papers.py")
    papers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(papers)
    data = papers.load()
    assert papers.problems(data) == []
    assert (ROOT / "benchmarks" / "PAPERS.md").read_text() == papers.render(data) + "\n", "run python benchmarks/papers.py"
    assert all(len(rows) >= 5 for rows in data.values())
    # the checks bite: a missing file, an unknown status, a table sweep nobody names
    broken = {k: [dict(r) for r in rows] for k, rows in data.items()}
    broken["mupfl"][0] |= {"status": "done", "files": ["benchmarks/mupfl/NOPE.md"]}
    broken["fedac"] = [r for r in broken["fedac"] if "table1_fmnist.toml" not in r.get("command", "")]
    found = "\n".join(papers.problems(broken))
    assert "NOPE.md does not exist" in found and "status 'done'" in found
    assert "benchmarks/fedac/table1_fmnist.toml: a table or figure sweep" in found
    # a runnable row names the file that will show it, and a row whose own runs exist says what ran
    broken = {k: [dict(r) for r in rows] for k, rows in data.items()}
    table1 = next(r for r in broken["fedac"] if r["item"] == "Table 1")
    table1["status"] = "runnable"
    fig4c = next(r for r in broken["fedac"] if r["item"] == "Fig. 4(c)")
    del fig4c["files"]
    found = "\n".join(papers.problems(broken))
    assert "fedac Table 1: says it has not run, but benchmarks/fedac/table1_fmnist.toml, " in found
    assert "fedac Fig. 4(c): a runnable row names its command and the files" in found
