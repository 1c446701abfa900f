"""How many classes each client's stage task holds in the sweeps' partitions (``--balanced`` shards).

    python benchmarks/gldp/stage_classes.py [RUNS_DIR]

Reads the ``partition.json`` of every FedAvg seed-0 run under ``benchmarks/gldp/runs/stages`` and
``runs/spatial`` (the partition depends on the setting and seed only) and prints, per setting, how
many stage tasks hold 1, 2, ... classes: equal label shards cut from a long-tailed pool give a
head class more shards than there are stage tasks, so some stage tasks take it twice and hold
fewer than S classes (README.md, "Protocol").
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz

RUNS = Path("benchmarks/gldp/runs")  # from the repository root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=Path, default=RUNS)
    runs = parser.parse_args().runs
    rows = []
    for folder in ("spatial", "stages"):
        for path in sorted((runs / folder).glob("*/fedavg/seed0/")):
            text = read_record(path, "partition.json")
            if text is None:
                continue
            part = json.loads(text)
            sizes = Counter(len(stage["classes"]) for client in part["clients"] for stage in client["stages"])
            rows.append((path.parts[-3], sizes))
    if not rows:
        raise SystemExit(f"no partition.json under {runs}/spatial or {runs}/stages")
    widths = sorted({k for _, sizes in rows for k in sizes})
    print("| setting | " + " | ".join(f"{k} classes" for k in widths) + " |")
    print("|---|" + "---:|" * len(widths))
    for setting, sizes in rows:
        total = sum(sizes.values())
        cells = [f"{100 * sizes[k] / total:.0f} %" if sizes[k] else "—" for k in widths]
        print(f"| {setting} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
