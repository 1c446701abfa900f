"""Expected wall time of the GLDP sweeps, from the cost probe's measured seconds per round.

`fedtail sweep --dry-run` guesses a run's time from finished runs of the same sweep only, so before
the first run of a sweep finishes it has nothing to go by. This scales the probe
(probe_fmnist.toml: every method, 2 rounds of global optimisation, in the two kinds of setting)
to each planned run: seconds per round of the probe run of the same algorithm in the setting of
the same shape (M = 5 stage tasks or M = 1) times the run's rounds, plus the probe's per-run
start-up (loading and partitioning, measured as the sweep's wall time minus the runs' own).

    PYTHONPATH=src python benchmarks/gldp/estimate.py [SWEEP.toml ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from fedtail.sweep.spec import load_sweep

HERE = Path(__file__).parent
PROBE = HERE / "probe_fmnist.toml"
FILES = ["tables23_fmnist.toml", "table4_fmnist.toml", "table1_fmnist.toml", "validation_fmnist.toml"]
START_S = 4.0  # per run: interpreter, dataset and partition (the probe sweep: 133 s for 14 runs of 77 s)


def probe_rates() -> dict[tuple[int, str], float]:
    """(stage tasks M, algorithm) -> wall seconds per round in the probe."""
    rates = {}
    for run in load_sweep(PROBE).runs:
        summary = json.loads((run.dir / "summary.json").read_text())
        rates[(run.config.plan.num_stages, run.config.algorithm)] = summary["wall_time_s"] / run.config.rounds
    return rates


def main(files: list[str]) -> None:
    rates = probe_rates()
    seen: set[Path] = set()
    grand = 0.0
    for name in files or FILES:
        sweep = load_sweep(HERE / name if not Path(name).exists() else Path(name))
        per_method: dict[str, list[float]] = defaultdict(list)
        for run in sweep.runs:
            if run.dir.resolve() in seen:  # planned by an earlier file (shared folder): counted there
                continue
            seen.add(run.dir.resolve())
            c = run.config
            per_method[run.method].append(rates[(c.plan.num_stages, c.algorithm)] * c.rounds + START_S)
        total = sum(sum(v) for v in per_method.values())
        grand += total
        longest = max((max(v) for v in per_method.values()), default=0.0)
        print(f"{sweep.file.name}: {sum(len(v) for v in per_method.values())} new runs, {total / 3600:.1f} h "
              f"({total / 3600 / sweep.jobs:.1f} h at {sweep.jobs} in parallel), longest run {longest / 60:.0f} min")
        for method, secs in per_method.items():
            print(f"  {method:<18} {len(secs):>3} runs × {sum(secs) / len(secs) / 60:5.1f} min")
    print(f"all: {grand / 3600:.1f} h of runs")


if __name__ == "__main__":
    main(sys.argv[1:])
