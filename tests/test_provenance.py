"""Which code made a run: the commit of the package's git checkout, and whether its sources differ."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fedtail import provenance
from fedtail.provenance import code_info, describe_code
from fedtail.report.blocks import code_line, machines_line

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def package_at(monkeypatch):
    """Point code_info at another directory (its cache cleared before and after)."""

    def point(path):
        monkeypatch.setattr(provenance, "PACKAGE_DIR", path)
        code_info.cache_clear()

    yield point
    code_info.cache_clear()


def git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


@needs_git
def test_a_checkout_gives_its_commit_and_whether_the_package_sources_changed(tmp_path, package_at):
    repo = tmp_path / "repo"
    package = repo / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (repo / "notes.txt").write_text("outside the package\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "first")
    head = git(repo, "rev-parse", "HEAD")
    package_at(package)
    assert code_info()["commit"] == head and code_info()["modified"] is False
    # a change outside the package does not make the code modified
    (repo / "notes.txt").write_text("edited\n")
    code_info.cache_clear()
    assert code_info()["modified"] is False
    # an edit or a new file inside it does
    (package / "b.py").write_text("y = 2\n")
    code_info.cache_clear()
    info = code_info()
    assert info["commit"] == head and info["modified"] is True
    assert describe_code(info) == f"fedtail {info['fedtail']}, commit {head[:12]} (sources modified since)"


def test_an_installed_copy_has_no_commit(tmp_path, package_at):
    package_at(tmp_path)  # not inside any git checkout
    info = code_info()
    assert info["commit"] is None and info["modified"] is None
    assert describe_code(info).endswith("not a git checkout")


def test_the_report_counts_runs_per_code():
    a = {"fedtail": "0.1.0", "commit": "a" * 40, "modified": False}
    b = {"fedtail": "0.1.0", "commit": "b" * 40, "modified": True}
    line = code_line([{"code": a}, {"code": b}, {"code": a}, {}])
    assert line == (
        f"- Code of the runs: fedtail 0.1.0, commit {'a' * 12}: 2 runs; "
        f"fedtail 0.1.0, commit {'b' * 12} (sources modified since): 1 run; "
        "not recorded (finished before fedtail recorded it): 1 run"
    )
    assert code_line([]) == "- Code of the runs: no finished run"


def test_the_report_counts_runs_per_machine_and_names_a_run_resumed_elsewhere():
    def machine(cap):
        return {"platform": "Linux-1", "cpu": "EPYC", "cpu_capability": cap, "cores": 2, "torch": "2.13.0+cpu"}

    one = {"machine": machine("AVX2"), "pieces": [{"from_round": 1, "cpu_capability": "AVX2"}]}
    old = {"machine": machine("AVX512")}  # finished before pieces were recorded
    moved = {
        "machine": machine("AVX512"),
        "pieces": [
            {"from_round": 1, "cpu_capability": "AVX2"},
            {"from_round": 181, "cpu_capability": "AVX512"},
        ],
    }
    line = machines_line([one, moved, one, old, {}])
    assert line == (
        "- Machines of the runs: CPU EPYC (AVX2), 2 cores, torch 2.13.0+cpu: 2 runs; "
        "CPU EPYC (AVX2, then AVX512), 2 cores, torch 2.13.0+cpu: 1 run; "
        "CPU EPYC (AVX512), 2 cores, torch 2.13.0+cpu: 1 run; "
        "not recorded (finished before fedtail recorded it): 1 run"
    )
    assert machines_line([]) == "- Machines of the runs: no finished run"
