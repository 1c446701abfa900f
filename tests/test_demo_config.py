"""`make demo`'s configuration builds for every algorithm the Makefile runs with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from fedtail.components import build_config

ROOT = Path(__file__).resolve().parents[1]


def demo_algorithms() -> list[str]:
    line = next(l for l in (ROOT / "Makefile").read_text().splitlines() if "configs/demo.toml" in l)
    return re.search(r"--algorithms (\S+)", line).group(1).split(",")


def test_demo_runs_mupfl_against_its_baselines_on_a_long_tail():
    algorithms = demo_algorithms()
    assert set(algorithms) == {"mupfl", "ditto", "fedavg", "local"}
    raw = tomllib.loads((ROOT / "configs" / "demo.toml").read_text())
    for name in algorithms:
        config = build_config(raw | {"algorithm": name})
        assert config.algorithm == name
        assert config.partition.imbalance > 1  # long-tailed
