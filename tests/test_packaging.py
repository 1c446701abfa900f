"""The package as a user installs it: a wheel and an sdist built from the project (setuptools' own
PEP 517 hooks, no network), without the benchmarks' run folders; the wheel's code, installed on its
own, answers `fedtail --version`, `fedtail list` and runs a round on generated data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import fedtail

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in", "src")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, sdist) of a copy of the project (so the build leaves nothing in the checkout)."""
    tree = tmp_path_factory.mktemp("project")
    for name in PROJECT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, tree / name)
    runs = tree / "benchmarks" / "paper" / "runs" / "s" / "m" / "seed0"  # a committed run folder's kind
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl.gz").write_bytes(b"")
    dist = tree / "dist"
    built = []
    for hook in ("build_wheel", "build_sdist"):
        code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        res = subprocess.run([sys.executable, "-c", code, str(dist)], cwd=tree, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        built.append(dist / res.stdout.strip().splitlines()[-1])
        assert built[-1].is_file(), (res.stdout[-2000:], sorted(dist.iterdir()))
    return built[0], built[1]


def test_wheel_and_sdist_hold_the_package_and_no_run_folders(built):
    wheel, sdist = built
    assert wheel.name == f"fedtail-{fedtail.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "fedtail/engine/simulation.py" in names and "fedtail/algorithms/mupfl/acmu.py" in names
    assert not [n for n in names if n.startswith("benchmarks/") or "/runs/" in n]
    assert f"Version: {fedtail.__version__}" in metadata
    # torch is a range, never pinned to one build (a lent GPU machine has its own torch)
    torch_req = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    assert torch_req and "==" not in torch_req[0]
    with tarfile.open(sdist) as t:
        members = t.getnames()
    assert any(m.endswith("/LICENSE") for m in members) and any(m.endswith("/CHANGELOG.md") for m in members)
    assert not [m for m in members if "/benchmarks/" in m or m.endswith("metrics.jsonl.gz")]


def test_the_installed_wheel_runs(built, tmp_path):
    wheel, _ = built
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(target))  # the wheel's code first; its dependencies from this venv

    def fedtail_cli(*args: str) -> str:
        code = "import sys; from fedtail.cli.main import app; sys.argv = ['fedtail', *sys.argv[1:]]; app()"
        res = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout + res.stderr

    where = subprocess.run([sys.executable, "-c", "import fedtail; print(fedtail.__file__)"], env=env,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert where.startswith(str(target))  # the installed copy, not the checkout's src/
    assert fedtail_cli("--version").strip() == f"fedtail {fedtail.__version__}"
    assert " mupfl " in fedtail_cli("list")
    fedtail_cli("run", "-a", "fedavg", "--dataset", "synthetic", "--model", "mlp", "--clients", "4", "--rounds", "1",
                "--out", str(tmp_path / "r"))  # fmt: skip
    assert (tmp_path / "r" / "summary.json").is_file()
