"""Seconds per round of FedAvg: the simulator and a loopback Flower deployment, side by side.

    python benchmarks/flower_rounds.py [--rounds 3] [--nodes 2] [--fraction 1.0]   (or make bench-flower)

Fashion-MNIST, long-tailed (IF 10, Dirichlet 0.5), 20 clients, 1 local epoch, batch 64,
`cnn-fmnist`, evaluation only after the last round. The same config runs in the simulator (one
process) and on a SuperLink with --nodes SuperNodes on 127.0.0.1 (node k hosts clients c with
c mod nodes = k); the final metrics must agree bit for bit. Per round = (wall time - evaluation) /
rounds, from each run's summary.json. For the Flower run, the time is split by where it went:
the SuperNodes' per-message process start, the ClientApp handler (data, state files, tasks) and
the rest of the server's wait (Flower's polling, transfers, serialisation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from fedtail.components import build_config
from fedtail.flower.deploy import LocalDeployment
from fedtail.runner import run_to_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--fraction", type=float, default=1.0)
    args = parser.parse_args()
    raw = {
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "model": "cnn-fmnist",
        "partition": {"scheme": "dirichlet", "num_clients": 20, "alpha": 0.5, "imbalance": 10},
        "train": {"local_epochs": 1, "batch_size": 64, "lr": 0.01},
        "fraction": args.fraction,
        "rounds": args.rounds,
        "eval_every": args.rounds,
        "checkpoint_every": 0,
        "seed": 0,
    }
    config = build_config(raw)
    work = Path(tempfile.mkdtemp(prefix="fedtail-flower-bench-"))

    start = time.perf_counter()
    sim = run_to_folder(config, work / "sim")
    sim_wall = time.perf_counter() - start

    start = time.perf_counter()
    with LocalDeployment(work / "flower" / "flower", args.nodes) as deployment:
        started = time.perf_counter() - start
        flower = deployment.run(config, work / "flower")
    flower_total = time.perf_counter() - start

    def per_round(summary: dict) -> float:
        return (summary["wall_time_s"] - summary["time_s"]["evaluation"]) / config.rounds

    times = flower["flower"]["time_s"]
    exchanges = flower["flower"]["exchanges"]
    result = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "torch": torch.__version__,
        "rounds": config.rounds,
        "clients_per_round": config.clients_per_round,
        "nodes": args.nodes,
        "sim_s_per_round": round(per_round(sim), 2),
        "flower_s_per_round": round(per_round(flower), 2),
        "sim_client_compute_s_per_round": round(sim["time_s"]["client_tasks"] / config.rounds, 2),
        "flower_exchanges": exchanges,
        "flower_wait_s_per_exchange": round(times["exchange_s"] / exchanges, 2),
        "flower_node_process_start_s_per_message": round(times["node_process_start_s"] / (exchanges * args.nodes), 2),
        "flower_node_handler_s_per_message": round(times["node_handler_s"] / (exchanges * args.nodes), 2),
        "flower_deployment_start_s": round(started, 1),
        "flower_total_s": round(flower_total, 1),
        "sim_total_s": round(sim_wall, 1),
        "same_final_metrics": sim["final"] == json.loads(json.dumps(flower["final"])),
        "wire_bytes_down": flower["bytes"]["wire_down"],
        "payload_bytes_down": flower["bytes"]["down"],
    }
    print(f"{'':28}{'simulator':>12}{'Flower':>12}")
    print(f"{'seconds per round':28}{result['sim_s_per_round']:>12}{result['flower_s_per_round']:>12}")
    print(f"Flower, per exchange ({exchanges}: {config.rounds} rounds + the evaluation): server wait "
          f"{result['flower_wait_s_per_exchange']} s; per node message: process start "
          f"{result['flower_node_process_start_s_per_message']} s, handler {result['flower_node_handler_s_per_message']} s")
    print(json.dumps(result))
    if not result["same_final_metrics"]:
        raise SystemExit("the simulator and Flower disagree")


if __name__ == "__main__":
    main()
