"""A short probe of MuPFL's readings on VALIDATION data (issue 16): a few rounds of the Table II
protocol (Fashion-MNIST, cnn-fmnist, 50 clients, alpha 0.5, IF 10, 20 % per round, 10 local
epochs, batch 64, lr 0.005 decayed per round), every client holding out 15 % of its training
samples, personalised accuracy on those held-out samples (the test split is never used).
Not a substitute for validation2_fmnist.toml (40 rounds): a first look, a few minutes per variant.

Run:  python benchmarks/mupfl/reading_probe.py NAME [--rounds 4] [key=value ...]
      (key=value: MuPFL options, e.g. reading=global-start pkcf_order=before-local)
Appends one record per call to benchmarks/mupfl/reading_probe.json.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import torch

from fedtail.components import build_config
from fedtail.config import parse_value
from fedtail.engine import prepare
from fedtail.engine.callbacks import Rows
from fedtail.engine.simulation import Simulation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("options", nargs="*", help="MuPFL options as key=value")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--algorithm", default="mupfl")
    args = parser.parse_intermixed_args()
    options = {k: parse_value(v) for k, v in (o.split("=", 1) for o in args.options)}
    config = build_config(
        {
            "algorithm": args.algorithm,
            "dataset": "fmnist",
            "model": "cnn-fmnist",
            "partition": {"scheme": "dirichlet", "num_clients": 50, "alpha": 0.5, "imbalance": 10, "val_fraction": 0.15},
            "train": {"local_epochs": 10, "batch_size": 64, "lr": 0.005, "lr_decay": 0.98343},
            "fraction": 0.2,
            "rounds": args.rounds,
            "eval_every": args.eval_every,
            "eval_split": "val",
            "eval_global": False,
            "options": options,
            "seed": 0,
        }
    )
    dataset, partition = prepare(config)
    rows: list[dict] = []
    sim = Simulation(config, dataset, partition, callbacks=[Rows(rows)])
    start = time.perf_counter()
    sim.run()
    seconds = time.perf_counter() - start
    features = getattr(sim.server, "features", None)
    record = {
        "name": args.name,
        "algorithm": args.algorithm,
        "options": options,
        "rounds": args.rounds,
        "val_acc_by_round": {r["round"]: round(r["personalized_acc"], 4) for r in rows},
        "pkcf_match_last": sim.round_logs[-1].get("pkcf_match") if sim.round_logs else rows[-1]["rounds_log"][-1].get("pkcf_match"),
        "feature_norm_mean": None if features is None else round(float(features.features.norm(dim=1).mean()), 3),
        "seconds": round(seconds, 1),
        "date": date.today().isoformat(),
        "torch": torch.__version__,
    }
    print(json.dumps(record))
    out = Path(__file__).with_suffix(".json")
    records = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps(records + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
