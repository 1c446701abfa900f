"""The "before" row of ``server_scaling.py``: ACMU and FedAC with fedtail before issue 21.

Runs the former server functions (k-means and silhouettes on the d-dimensional embedding;
scikit-learn's full-SVD PCA and d-dimensional CNT distances) on the same synthetic vectors as
``server_scaling.py``, so it needs the code of that time on the path:

    mkdir -p /tmp/before && git archive 0301249 src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src python benchmarks/server_scaling_before.py --sizes 10,100,1000

(``0301249``: the last commit of main before issue 21.) One line per method and size: wall and
CPU seconds, BLAS limited to one thread as in ``server_scaling.py``; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_scaling import CLUSTERS, OFFSET, parse_sizes, vectors  # noqa: E402


def acmu(n: int, d: int, seed: int):
    from fedtail.algorithms.mupfl.acmu import cluster_clients, embedding, project_2d

    rows, truth = vectors(n, d, seed, OFFSET.get("acmu", 0.0))
    g = torch.Generator().manual_seed(seed + 1)
    maps = torch.rand(CLUSTERS, 1024, generator=g)[truth] + 0.3 * torch.rand(n, 1024, generator=g)

    def work():
        points = embedding(rows, maps, 0.25)
        cluster_clients(points, kappa=None, kappa_min=2, kappa_max=6, seed=seed)
        project_2d(points)

    return work


def fedac(n: int, d: int, seed: int):
    from fedtail.algorithms.fedac import e_step, fit_map, m_step, tune_clusters

    rows, truth = vectors(n, d, seed, OFFSET["fedac"])
    centres, _ = m_step(rows, truth % 4, None)

    def work():  # FedACServer.run_round of that time, after the uploads, in a round that refits the map
        pca = fit_map(rows, 50, seed)
        labels = e_step(rows, centres, "lrcos", pca, True)
        means, labels = m_step(rows, labels, None)
        labels, _ = tune_clusters(rows, labels, means, 0.2, 0.8, 20, seed)
        m_step(rows, labels, None)

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--methods", default="acmu,fedac")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seconds: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    for method in args.methods.split(","):
        seconds[method], cpu[method] = {}, {}
        for n in parse_sizes(args.sizes):
            work = {"acmu": acmu, "fedac": fedac}[method](n, args.dim, args.seed)
            with threadpool_limits(1):
                wall, used = time.perf_counter(), time.process_time()
                work()
                wall, used = time.perf_counter() - wall, time.process_time() - used
            seconds[method][str(n)], cpu[method][str(n)] = round(wall, 2), round(used, 2)
            print(f"{method} n = {n}: {wall:.2f} s wall, {used:.2f} s CPU", flush=True)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "dim": args.dim}))


if __name__ == "__main__":
    main()
