"""The mean of each run's final evaluations: a noise check beside the validation rule's round 1000.

    python benchmarks/fedac/final_evaluations.py [--last N] RUN_DIR [RUN_DIR ...]

The 1000-round validation (``validation1000_fmnist.toml``) evaluates every 10 rounds and its
rule reads round 1000 alone. Where a method's curve swings between evaluations (IFCA's by up to
1.3 points), this prints, per run folder, the final round's personalised accuracy and the mean of
its last N evaluations (default 10: rounds 910-1000), in percent, as a Markdown table; README.md,
"Status", quotes it for IFCA's K grid. It is a check, not the rule.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz


def evaluations(run: Path) -> list[tuple[int, float]]:
    """(round, personalised accuracy in percent) of every evaluated round of ``run``."""
    text = read_record(run, "metrics.jsonl")
    if text is None:
        raise SystemExit(f"{run}: no metrics.jsonl (not a run folder)")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = [(r["round"], 100 * r["personalized_acc"]) for r in rows if r.get("personalized_acc") is not None]
    if not out:
        raise SystemExit(f"{run}: no evaluated round in metrics.jsonl")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--last", type=int, default=10, help="how many final evaluations to average")
    args = parser.parse_args()
    if args.last < 1:
        parser.error("--last must be at least 1")
    print(f"| run | final round | final (%) | mean of the last {args.last} evaluations (%) | their rounds |")
    print("|---|---:|---:|---:|---|")
    for run in args.runs:
        evals = evaluations(run)
        tail = evals[-args.last :]
        mean = sum(acc for _, acc in tail) / len(tail)
        last_round, last_acc = evals[-1]
        print(f"| {run} | {last_round} | {last_acc:.2f} | {mean:.2f} | {tail[0][0]}–{last_round} |")


if __name__ == "__main__":
    main()
