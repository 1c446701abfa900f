"""How fast a run's accuracy still rises: the rounds probe's numbers behind the FedReMa files' rounds.

    python benchmarks/fedrema/rounds_slope.py [RUN_DIR]

RUN_DIR (default: the rounds probe's FedAvg run) is any run folder with ``metrics.jsonl``. Prints,
as Markdown tables, the rule written before the probe ran (the mean personalised accuracy of the
evaluations in rounds 80-100 against rounds 180-200) and the slope of a least-squares line
through the evaluations of each 50-round window, in points per 100 rounds; README.md, "Rounds",
quotes them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz

DEFAULT = Path("benchmarks/fedrema/runs/rounds-probe/s0.2/fedavg/seed0")  # from the repository root
WINDOWS = [(0, 50), (50, 100), (100, 150), (150, 200), (200, 250), (250, 300)]


def curve(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """The evaluated rounds and their personalised accuracy in percent."""
    rows = [json.loads(line) for line in (read_record(run, "metrics.jsonl") or "").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("personalized_acc") is not None]
    if not rows:
        raise SystemExit(f"{run}: no evaluated round in metrics.jsonl")
    return np.array([r["round"] for r in rows]), 100 * np.array([r["personalized_acc"] for r in rows])


def window_mean(rounds: np.ndarray, acc: np.ndarray, lo: int, hi: int) -> float | None:
    inside = (rounds >= lo) & (rounds <= hi)
    return float(acc[inside].mean()) if inside.any() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT)
    run = parser.parse_args().run
    rounds, acc = curve(run)
    early, late = window_mean(rounds, acc, 80, 100), window_mean(rounds, acc, 180, 200)
    print(f"Run `{run}`: {len(rounds)} evaluations, rounds {rounds[0]}-{rounds[-1]}.\n")
    print("| rounds | mean accuracy (%) |\n|---|---:|")
    for (lo, hi), value in (((80, 100), early), ((180, 200), late)):
        print(f"| {lo}-{hi} | {'—' if value is None else f'{value:.2f}'} |")
    if early is not None and late is not None:
        print(f"\nGain from rounds 80-100 to 180-200: {late - early:+.2f} points (the rule: 100 rounds stand below 1).\n")
    print("| rounds | evaluations | slope (points per 100 rounds) |\n|---|---:|---:|")
    for lo, hi in WINDOWS:
        inside = (rounds >= lo) & (rounds <= hi)
        if inside.sum() < 3:
            continue
        slope = np.polyfit(rounds[inside], acc[inside], 1)[0] * 100
        print(f"| {lo}-{hi} | {int(inside.sum())} | {slope:.1f} |")


if __name__ == "__main__":
    main()
