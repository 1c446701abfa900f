"""docs/defaults.md lists every value a benchmark's main table sets unlike the library default.

"Defaults are the validated configuration": a table that silently overrides a default would show
a variant `fedtail run -a NAME` does not give. So each override in a main-table sweep file must
have its row in docs/defaults.md (algorithm, option, and the value the file sets); ablation and
sensitivity tables set options on purpose and are exempt. A new table file must be classified here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedtail.algorithms import ALGORITHMS
from fedtail.config import FinetuneConfig
from fedtail.sweep.spec import load_sweep

ROOT = Path(__file__).parent.parent
BENCHMARKS = ROOT / "benchmarks"
DOC = ROOT / "docs" / "defaults.md"

MAIN_TABLES = [
    "mupfl/table2_fmnist.toml",
    "mupfl/table3_fmnist_seg.toml",  # segmentation, the fmnist-seg proxy of Cityscapes
    "mupfl/table3_cityscapes.toml",  # the same on Cityscapes (not run here)
    "gldp/table1_fmnist.toml",
    "gldp/tables23_fmnist.toml",
    "fedac/table1_fmnist.toml",
    "fedac/table1_path3_k10_fmnist.toml",
    "fedrema/table1_fmnist.toml",
    "fedrema/table2_fmnist.toml",  # Table 1's methods and values at 100 samples, s 0.2-0.8
]
# Ablation / sensitivity rows: each sets an option on purpose (κ, module switches, λ, δ, variants),
# and the validation grids of such rows.
ABLATIONS = [
    "mupfl/table1_fmnist.toml",  # FedAvg / FL+HC / MuPFL at fixed cluster counts
    "mupfl/table5_fmnist.toml",
    "mupfl/table6_fmnist.toml",
    "mupfl/table4_fmnist_seg.toml",  # MuPFL's local epochs x classes per client (segmentation)
    "gldp/table4_fmnist.toml",
    "fedrema/table3_fmnist.toml",
    "fedrema/table5_fmnist.toml",
    "fedrema/table4_fmnist.toml",  # FedReMa+F, FedReMa+A&F: client_training variants
    "fedrema/table4_validation_fmnist.toml",  # the variants' λ grid
]


def effective_defaults(algorithm: str) -> dict:
    """The options a run of ``algorithm`` gets with no --set: the config defaults under its reference's."""
    algo = ALGORITHMS[algorithm]
    return algo.config(**dict(algo.reference.options)).model_dump()


def overrides(path: Path) -> set[tuple[str, str, object]]:
    """(algorithm, option, value) for every option a run of the sweep file sets unlike the default."""
    found = set()
    for run in load_sweep(path).runs:
        algorithm = run.config.algorithm
        defaults = effective_defaults(algorithm)
        options = ALGORITHMS[algorithm].config(**run.config.options).model_dump()
        for key, value in options.items():
            if value != defaults[key]:
                found.add((algorithm, key, value if not isinstance(value, list) else tuple(value)))
        # the fine-tuning before evaluation, against the algorithm's reference (an engine setting)
        reference = FinetuneConfig(**dict(ALGORITHMS[algorithm].reference.finetune)).model_dump()
        for key, value in run.config.finetune.model_dump().items():
            if value != reference[key]:
                found.add((algorithm, f"finetune.{key}", value))
    return found


def doc_rows() -> dict[tuple[str, str], str]:
    """(algorithm, option) -> the row's text, from the table of docs/defaults.md."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([\w-]+)`\s*\|\s*(.+?)\s*\|", line)
        if m:
            for option in re.findall(r"`([\w.]+)`", m.group(2)):
                rows[(m.group(1), option)] = line
    return rows


def test_every_table_file_is_classified():
    tables = {str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.glob("*/table*.toml")}
    assert tables == set(MAIN_TABLES) | set(ABLATIONS)


def test_effective_defaults_apply_the_reference():
    # Per-FedAvg's reference (PFLlib) sets β = the run's lr and PFLlib's steps: not an override.
    assert effective_defaults("perfedavg")["steps"] == "pfllib"
    assert ("perfedavg", "steps", "pfllib") not in overrides(BENCHMARKS / "fedrema/table1_fmnist.toml")


@pytest.mark.parametrize("name", MAIN_TABLES)
def test_main_table_overrides_are_documented(name: str):
    rows = doc_rows()
    for algorithm, option, value in sorted(overrides(BENCHMARKS / name), key=str):
        row = rows.get((algorithm, option))
        assert row is not None, f"{name} sets {algorithm} {option} = {value!r}: no row in docs/defaults.md"
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.]|\.\d)", row.split("|")[4]), (
            f"{name} sets {algorithm} {option} = {shown}; docs/defaults.md's row does not name that value"
        )
