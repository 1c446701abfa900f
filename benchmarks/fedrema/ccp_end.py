"""When FedReMa's critical co-learning period ends for each δ, read from a run with MDS every round.

    python benchmarks/fedrema/ccp_end.py [RUN_DIR] [--deltas 0.1,0.3,0.5,0.7,0.9]

RUN_DIR (default: the CCP probe's ``mds-every-round`` run) must be a FedReMa run with
``ccp = false``, which logs the ratio Δs̄^t / max_{τ≤t} Δs̄^τ of Eq. 9 every round. A run with δ is
that run until its CCP ends, in the first round whose ratio is below δ (that round still uses
MDS), so the CCP of δ lasts that many rounds; "> R" means it outlasts the run's R rounds. Bit for
bit only on a CPU of the same instruction set: an AVX2 and an AVX512 machine round differently,
so a ratio within about 0.01 of δ may cross it a round earlier or later there.
Prints the ratio of every round, then one line per δ (Markdown tables).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz

DEFAULT = Path(__file__).parent / "runs/ccp-probe/s0.2/mds-every-round/seed0"
TIE = 1e-9  # fedtail.algorithms.fedrema.TIE: a ratio within it of δ counts as δ


def ratios(run: Path) -> list[dict]:
    """The ``fedrema`` record of every round, in order (rounds after the last evaluation included)."""
    rows = [json.loads(line) for line in (read_record(run, "metrics.jsonl") or "").splitlines()]
    records = [log["fedrema"] for row in rows for log in row["rounds_log"]]
    summary = json.loads((run / "summary.json").read_text())
    records += [log["fedrema"] for log in summary.get("rounds_log", [])]
    if any(not r["ccp"] or r.get("ended") for r in records):
        raise SystemExit(f"{run}: the CCP ended in this run; use a run with ccp = false")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--deltas", default="0.1,0.3,0.5,0.7,0.9")
    args = parser.parse_args()
    records = ratios(args.run)
    print("| round | mean Δs | ratio | mean set size |\n|---:|---:|---:|---:|")
    for t, r in enumerate(records, 1):
        sizes = r["set_sizes"]
        print(f"| {t} | {r['mean_gap']:.4f} | {r['ratio']:.4f} | {sum(sizes) / len(sizes):.2f} |")
    print("\n| δ | CCP rounds |\n|---:|---:|")
    for delta in (float(d) for d in args.deltas.split(",")):
        end = next((t for t, r in enumerate(records, 1) if r["ratio"] < delta - TIE), None)
        print(f"| {delta:g} | {end if end is not None else f'> {len(records)}'} |")


if __name__ == "__main__":
    main()
