"""Seconds of FedAC's server steps per round for 100 known client models of a given size.

FedAC's server keeps every client's last upload and, each round, runs the E-step (LrCos: the
models through the PCA map), the M-step and CNT's G_c over all of them, in float64; every
`pca_every` rounds it refits the PCA map on them. Times each on 100 random rows (a shared
offset plus noise; only the sizes matter, except that CNT's splits, data-dependent k-means
runs, are left out) with one thread, for each dimension given. The steps are linear in the
dimension, so two sizes tell what a larger model costs. Prints one JSON line per dimension.

Run: PYTHONPATH=src python benchmarks/fedac/server_cost.py 44426 346023 865058
"""

from __future__ import annotations

import json
import sys
import time

import torch

from fedtail.algorithms.fedac import e_step, fit_map, granularity, initial_labels, m_step

CLIENTS = 100


def seconds(f) -> float:
    start = time.perf_counter()
    f()
    return round(time.perf_counter() - start, 3)


def main(dims: list[int]) -> None:
    torch.set_num_threads(1)
    for d in dims:
        g = torch.Generator().manual_seed(0)
        models = torch.randn(d, generator=g) + 0.05 * torch.randn(CLIENTS, d, generator=g)
        start = time.perf_counter()
        pca = fit_map(models, 50, 0)
        pca_s = round(time.perf_counter() - start, 3)
        centres, labels = m_step(models, initial_labels(models, 8, pca, True, 0), None)
        steps = {
            "e_step": seconds(lambda: e_step(models, centres, "lrcos", pca, True)),
            "m_step": seconds(lambda: m_step(models, labels, None)),
            "gc": seconds(lambda: granularity(models, labels, centres)),
        }
        # A round: E-step, M-step, G_c, and the M-step after CNT.
        round_s = steps["e_step"] + 2 * steps["m_step"] + steps["gc"]
        print(json.dumps({"dim": d, "clients": CLIENTS, "pca_fit_s": pca_s, "round_s": round(round_s, 3)} | steps))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]])
