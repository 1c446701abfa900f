"""Paired per-client comparison of two methods of one sweep, seed by seed.

Two methods run on the same seed see the same partition and the same clients' test samples, so
their per-client accuracies pair up. For each seed this prints the mean difference over the
clients (A - B, points), how many clients A wins, ties and loses, and a Wilcoxon signed-rank test
over the clients (zero differences dropped, two-sided; SciPy). A tie of the means with a large p
says "no difference this many clients can show", not "equal".

Per-client accuracy: the final round's ``per_client_acc``, or with ``--last 10`` the mean of each
client's accuracy over the last 10 evaluated rounds of ``metrics.jsonl``.

    python benchmarks/fedac/paired_clients.py benchmarks/fedac/runs/table1/path3 fedac local
    python benchmarks/fedac/paired_clients.py benchmarks/fedac/runs/table1/dir0.1 fedac fedper --last 10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

from fedtail.report.runfiles import read_record  # metrics.jsonl or its .gz


def per_client(run: Path, last: int) -> np.ndarray:
    rows = [json.loads(line) for line in (read_record(run, "metrics.jsonl") or "").splitlines() if line.strip()]
    rows = sorted((r for r in rows if isinstance(r.get("per_client_acc"), list)), key=lambda r: r["round"])
    if not rows:
        raise SystemExit(f"{run}: no evaluated round with per_client_acc in metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    if summary.get("status") != "finished":
        raise SystemExit(f"{run}: not a finished run (summary.json status {summary.get('status')!r})")
    return np.mean([np.asarray(r["per_client_acc"], dtype=float) for r in rows[-last:]], axis=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("setting", type=Path, help="a setting's folder of a sweep (holds one folder per method)")
    ap.add_argument("a", help="method A (folder name)")
    ap.add_argument("b", help="method B (folder name)")
    ap.add_argument("--last", type=int, default=1, help="mean of the last N evaluated rounds (default 1: the final round)")
    args = ap.parse_args(argv)
    if args.last < 1:
        ap.error("--last must be at least 1")
    seeds = sorted(p.name for p in (args.setting / args.a).glob("seed*") if (args.setting / args.b / p.name).is_dir())
    if not seeds:
        raise SystemExit(f"no seed folder that both {args.setting / args.a} and {args.setting / args.b} hold")
    what = "final round" if args.last == 1 else f"mean of the last {args.last} evaluations"
    print(f"{args.setting}: {args.a} - {args.b}, per-client accuracy ({what}), points")
    print("seed   clients  mean diff  A wins  ties  A loses  Wilcoxon p")
    for seed in seeds:
        a = per_client(args.setting / args.a / seed, args.last)
        b = per_client(args.setting / args.b / seed, args.last)
        if a.shape != b.shape:
            raise SystemExit(f"{seed}: {a.size} clients against {b.size}: not the same partition")
        d = 100 * (a - b)
        nonzero = d[np.abs(d) > 1e-9]
        p = wilcoxon(nonzero).pvalue if nonzero.size else float("nan")
        wins, losses = int((d > 1e-9).sum()), int((d < -1e-9).sum())
        print(f"{seed:<6} {d.size:>7}  {d.mean():>+9.2f}  {wins:>6}  {d.size - wins - losses:>4}  {losses:>7}  {p:>10.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
