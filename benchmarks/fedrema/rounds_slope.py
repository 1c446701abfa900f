"""How fast a run's accuracy still rises: the rounds probe's numbers behind the FedReMa files' rounds.

    python benchmarks/fedrema/rounds_slope.py [RUN_DIR ...]

RUN_DIR (default: the rounds probe's FedAvg run) is any run folder with ``metrics.jsonl``. Prints,
as Markdown tables, the rule written before the probe ran (the mean personalised accuracy of the
evaluations in rounds 80-100 against rounds 180-200) and the slope of a least-squares line
through the evaluations of each 50-round window, in points per 100 rounds; README.md, "Rounds",
quotes them. When every run given reaches round 500 (the Table 2 rounds probe's two runs) it also
prints the rounds Table 2's rule gives for them together.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz

DEFAULT = Path("benchmarks/fedrema/runs/rounds-probe/s0.2/fedavg/seed0")  # from the repository root
WINDOWS = [(lo, lo + 50) for lo in range(0, 500, 50)]
# Table 2's rule (rounds_probe_table2_fmnist.toml, written before its run): the smallest candidate R
# whose window R-50..R has a slope of at most SLOPE_LIMIT points per 100 rounds in every probe run,
# else the last. SLOPE_LIMIT is the slope at which Table 1's 200 rounds stopped (its probe's rounds
# 150-200: 1.351), compared at two decimals.
CANDIDATES = (200, 300, 400, 500)
SLOPE_LIMIT = 1.35


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


def slope(rounds: np.ndarray, acc: np.ndarray, lo: int, hi: int) -> float | None:
    """Points per 100 rounds of a least-squares line through the evaluations in rounds lo..hi (3 or more)."""
    inside = (rounds >= lo) & (rounds <= hi)
    return float(np.polyfit(rounds[inside], acc[inside], 1)[0] * 100) if inside.sum() >= 3 else None


def rounds_by_slope(curves: list[tuple[np.ndarray, np.ndarray]]) -> int | None:
    """Table 2's rounds: the first candidate whose last 50 rounds rise by at most SLOPE_LIMIT in every
    curve, else the last candidate; None if a curve lacks the evaluations of a candidate's window."""
    for r in CANDIDATES:
        values = [slope(rounds, acc, r - 50, r) for rounds, acc in curves]
        if any(v is None for v in values):
            return None
        if all(round(v, 2) <= SLOPE_LIMIT for v in values):
            return r
    return CANDIDATES[-1]


def report(run: Path, rounds: np.ndarray, acc: np.ndarray) -> None:
    early, late = window_mean(rounds, acc, 80, 100), window_mean(rounds, acc, 180, 200)
    print(f"Run `{run}`: {len(rounds)} evaluations, rounds {rounds[0]}-{rounds[-1]}.\n")
    print("| rounds | mean accuracy (%) |\n|---|---:|")
    for (lo, hi), value in (((80, 100), early), ((180, 200), late)):
        print(f"| {lo}-{hi} | {'—' if value is None else f'{value:.2f}'} |")
    if early is not None and late is not None:
        print(f"\nGain from rounds 80-100 to 180-200: {late - early:+.2f} points (the rule: 100 rounds stand below 1).\n")
    print("| rounds | evaluations | slope (points per 100 rounds) |\n|---|---:|---:|")
    for lo, hi in WINDOWS:
        value = slope(rounds, acc, lo, hi)
        if value is not None:
            print(f"| {lo}-{hi} | {int(((rounds >= lo) & (rounds <= hi)).sum())} | {value:.2f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (default: Table 1's rounds probe)")
    runs = parser.parse_args().runs or [DEFAULT]
    curves = [curve(run) for run in runs]
    for run, (rounds, acc) in zip(runs, curves):
        report(run, rounds, acc)
    if all(rounds[-1] >= CANDIDATES[-1] for rounds, _ in curves):
        chosen = rounds_by_slope(curves)
        print(f"Table 2's rule (the first of {', '.join(map(str, CANDIDATES))} whose last 50 rounds rise by at most "
              f"{SLOPE_LIMIT:.2f} points per 100 rounds in all {len(curves)} run(s), else {CANDIDATES[-1]}): "
              f"{'not decidable (a window lacks 3 evaluations)' if chosen is None else f'{chosen} rounds'}.")


if __name__ == "__main__":
    main()
