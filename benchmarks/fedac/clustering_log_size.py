"""Size of a run's metrics.jsonl had it logged full clustering records only every K rounds.

Reads the `metrics.jsonl` of runs that logged a full `clustering` record every round (fedtail
before `--log-clustering-every`, or `--log-clustering-every 1`), measures a full and a light
record (what rounds between full ones keep: the number of clusters and the method's small
entries) and rewrites the file in memory for several K, as `fedtail.algorithms.clustering` would
have logged it. Prints one JSON line per run; sizes in bytes.

Run: python benchmarks/fedac/clustering_log_size.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz

VIEWS = ("clients", "clusters", "pca", "round_clients", "round_pca")  # only in full records
EVERY = (1, 5, 10, 20, 25, 50, 100)


def line_bytes(row: dict) -> int:
    return len(json.dumps(row)) + 1  # as runfiles.metrics_line writes it


def main(dirs: list[str]) -> None:
    for folder in dirs:
        rows = [json.loads(line) for line in (read_record(folder, "metrics.jsonl") or "").splitlines()]
        last = max(e["round"] for r in rows for e in r["rounds_log"])
        records = [e["clustering"] for r in rows for e in r["rounds_log"] if "clustering" in e]
        full = [len(json.dumps({"clustering": c})) + 2 for c in records]  # the key, ": " and ", " in the entry
        light = [len(json.dumps({"clustering": {k: v for k, v in c.items() if k not in VIEWS}})) + 2 for c in records]

        def rewritten(every: int) -> int:
            total = 0
            for r in rows:
                logs = []
                for e in r["rounds_log"]:
                    if "clustering" in e and not (e["round"] % every == 0 or e["round"] == last):
                        e = e | {"clustering": {k: v for k, v in e["clustering"].items() if k not in VIEWS}}
                    logs.append(e)
                total += line_bytes(r | {"rounds_log": logs})
            return total

        bare = sum(
            line_bytes(r | {"rounds_log": [{k: v for k, v in e.items() if k != "clustering"} for e in r["rounds_log"]]})
            for r in rows
        )
        print(
            json.dumps(
                {
                    "run": folder,
                    "rounds": last,
                    "records": len(records),
                    "clusters": [min(c["num_clusters"] for c in records), max(c["num_clusters"] for c in records)],
                    "full_record_mean": round(sum(full) / len(full)),
                    "full_record_max": max(full),
                    "light_record_mean": round(sum(light) / len(light)),
                    "light_record_max": max(light),
                    "file_without_clustering": bare,
                    "file_by_every": {k: rewritten(k) for k in EVERY},
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:])
