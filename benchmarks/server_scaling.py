"""Server-side cost of the clustered methods at cross-device scale (issue 21).

Part 1, seconds. For n clients in ``--sizes`` and d = ``--dim`` parameters, synthetic client
vectors with cluster structure (``--clusters`` random centres plus Gaussian spread, a shared
offset for the methods that compare whole models; seeded), and the server work of one round of
each method, through the functions the algorithms call (not copies):

- acmu: MuPFL's edge clustering: ``embedding`` (Gram matrices of the updates and of 1,024-value
  activation maps, α = 0.25), ``cluster_clients`` (k-means, n_init 10, for κ = 2..6 and their
  silhouettes) and the 2-D view, as ``ACMUEdge.reduce`` calls them;
- fedac: a round that refits the PCA map, as ``FedACServer.run_round``: the Gram matrix,
  ``fit_map_scores`` (D = 50), the E-step against 4 centres, CNT (``tune_clusters``), the M-step;
- fesem: its first round, as ``FeSEMServer.run_round``: k-means++ seeding of K = 5 centres, the
  E-step and the M-step;
- fedgroup: the group cold start of n pre-training clients: ``edc_groups`` (K = 5, m = 3) and the
  group means;
- flhc: the one clustering, as ``FLHCServer.cluster``: ``update_points``, Ward's tree cut into 5
  clusters, the cluster means and the 2-D view;
- ifca: the server part of a round with a full log record: the per-cluster weighted means of the
  n uploads (K = 5) and the 2-D view of the uploads;
- cgpfl: a re-clustering round: ``kmeans_labels`` (K = 5), the cluster means, the matching.

Each is timed once after one untimed warm-up at the smallest size: wall seconds (``seconds``)
and CPU seconds of this process (``cpu_seconds``, ``time.process_time``).

Part 2, memory. The peak resident set size (VmHWM, see :func:`peak_rss_mb`) of a fresh process running one round
of Ditto, MuPFL and FedAC with ``--rss-clients`` clients (default 1,000), every client sampled,
each holding a personal ``cnn-fmnist`` model (83,466 parameters), on a tiny synthetic image set
(3 training images per client, 1 local step), with ``--client-state`` memory and disk: what the
server and the clients' states hold, not training. ``peak_rss_mb`` is the largest of them.

The last line printed is JSON: ``{"seconds": {"acmu": {"10": …, "100": …, "1000": …}, …},
"cpu_seconds": {…}, "peak_rss_mb": …, "peak_rss_mb_by_run": {"ditto/memory": …, …}, …}``.

    python benchmarks/server_scaling.py [--sizes 10,100,1000] [--dim 100000] [--rss-clients 1000]
        [--methods acmu,fedac,...] [--out FILE.json]

``--rss-clients 0`` skips part 2. Server linear algebra runs with ``--threads`` BLAS threads
(default 1, the engine's default), as in a run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

METHODS = ("acmu", "fedac", "fesem", "fedgroup", "flhc", "ifca", "cgpfl")
RSS_METHODS = ("ditto", "mupfl", "fedac")
CLUSTERS = 5


# --- part 1: one round's server work ------------------------------------------------------------


def vectors(n: int, d: int, seed: int, offset: float = 0.0, clusters: int = CLUSTERS) -> tuple[torch.Tensor, np.ndarray]:
    """n float32 rows around ``clusters`` random centres (spread 2, a shared ``offset``); their clusters."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, d, generator=g)
    truth = torch.arange(n) % clusters
    rows = centres[truth] + 2.0 * torch.randn(n, d, generator=g)
    if offset:
        rows += offset * torch.randn(d, generator=g)
    return rows, truth.numpy()


def acmu(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.mupfl.acmu import cluster_clients, embedding, project_2d

    g = torch.Generator().manual_seed(seed + 1)
    maps = torch.rand(CLUSTERS, 1024, generator=g)[truth] + 0.3 * torch.rand(len(rows), 1024, generator=g)

    def work():
        points = embedding(rows, maps, 0.25)
        found = cluster_clients(points, kappa=None, kappa_min=2, kappa_max=6, seed=seed)
        project_2d(points)
        return found.kappa

    return work


def fedac(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.clustering import gram, relabel
    from fedtail.algorithms.fedac import e_step, fit_map_scores, m_step, tune_clusters

    centres, _ = m_step(rows, truth % 4, None)  # last round's 4 centres

    def work():  # FedACServer.run_round after the uploads, in a round that refits the map
        reference = rows[0].clone()
        g = gram(rows, reference)
        pca, scores = fit_map_scores(rows, 50, g, reference)
        labels = relabel(e_step(rows, centres, "lrcos", pca, True, scores))
        labels, _ = tune_clusters(g, labels, None, 0.2, 0.8, 20, seed, dim=rows.shape[1])
        return m_step(rows, labels, None)[0].shape[0]

    return work


def fesem(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.fesem import e_step, m_step, seeded_centres

    def work():
        centres = seeded_centres(rows, CLUSTERS, seed)
        labels = e_step(rows, centres)
        return m_step(rows, labels, centres).shape[0]

    return work


def fedgroup(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.clustering import cluster_means
    from fedtail.algorithms.fedgroup import edc_groups

    def work():
        labels, _, _ = edc_groups(rows, min(CLUSTERS, len(rows)), 3, seed)
        return len(cluster_means(rows, labels))

    return work


def flhc(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.clustering import cluster_means, project_2d
    from fedtail.algorithms.flhc import hierarchical_clusters, update_points

    def work():
        points = update_points(rows, "euclidean")
        labels = hierarchical_clusters(rows, "euclidean", "ward", CLUSTERS, None, points)
        cluster_means(rows, labels)
        project_2d(points)
        return int(labels.max()) + 1

    return work


def ifca(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.aggregate import WeightedMean
    from fedtail.algorithms.clustering import project_2d

    def work():
        means: dict[int, WeightedMean] = {}
        for row, j in zip(rows, truth):
            means.setdefault(int(j), WeightedMean()).add({"w": row}, 3.0)
        models = {j: mean.result() for j, mean in means.items()}
        project_2d(rows)
        return len(models)

    return work


def cgpfl(rows: torch.Tensor, truth: np.ndarray, seed: int):
    from fedtail.algorithms.cgpfl import kmeans_labels, match_to_centers
    from fedtail.algorithms.clustering import cluster_means

    centers = torch.stack([rows[truth == k].mean(0) for k in range(CLUSTERS)])

    def work():
        groups = kmeans_labels(rows, min(CLUSTERS, len(rows)), seed)
        means = cluster_means(rows, groups)
        return len(match_to_centers(torch.stack([means[g] for g in sorted(means)]), centers))

    return work


WORK = {"acmu": acmu, "fedac": fedac, "fesem": fesem, "fedgroup": fedgroup, "flhc": flhc, "ifca": ifca, "cgpfl": cgpfl}
OFFSET = {"fedac": 5.0, "fesem": 5.0, "ifca": 5.0, "cgpfl": 5.0}  # whole models share a large common part


def time_method(method: str, n: int, d: int, seed: int) -> tuple[float, float]:
    rows, truth = vectors(n, d, seed, OFFSET.get(method, 0.0))
    work = WORK[method](rows, truth, seed)
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


# --- part 2: peak memory of a round with many clients ------------------------------------------


def rss_run(method: str, clients: int, store: str, seed: int) -> float:
    """One round of ``method`` with ``clients`` clients in this process; its peak RSS (MB)."""
    from fedtail.components import build_config
    from fedtail.runner import run_to_folder

    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(seed)
        n = clients * 4  # 3 training images per client, 1 test image (20 % of each class is test)
        y = np.arange(n) % 10
        x = (rng.random((10, 1, 28, 28))[y] * 128 + rng.random((n, 1, 28, 28)) * 127).astype(np.uint8)
        np.savez(Path(tmp) / "data.npz", x=x, y=y)
        config = build_config(
            {
                "algorithm": method,
                "dataset": f"npz:{Path(tmp) / 'data.npz'}",
                "model": "cnn-fmnist",
                "partition": {"scheme": "iid", "num_clients": clients, "test_fraction": 0.34},
                "train": {"local_steps": 1, "batch_size": 3, "lr": 0.01},
                "fraction": 1.0,
                "rounds": 1,
                "seed": seed,
                "checkpoint_every": 0,
                "client_state": store,
            }
        )
        run_to_folder(config, Path(tmp) / "run")
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's peak resident set size, MB: VmHWM, else ``ru_maxrss``.

    ``ru_maxrss`` is not used first: Linux keeps it across exec, so a process started by a large
    parent (this benchmark, after its timings) would report the parent's peak instead of its own.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def rss(method: str, clients: int, store: str, seed: int) -> float:
    """:func:`rss_run` in a fresh process (ru_maxrss is a process's high-water mark)."""
    cmd = [sys.executable, __file__, "--rss-run", method, "--rss-clients", str(clients), "--client-state", store,
           "--seed", str(seed)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


# --- the command --------------------------------------------------------------------------------


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--sizes expects comma-separated client counts such as 10,100,1000 (got {text!r})") from None
    if not sizes or min(sizes) < 2:
        raise SystemExit(f"--sizes needs client counts >= 2 (got {text!r})")
    return sizes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000", help="client counts n (comma-separated)")
    parser.add_argument("--dim", type=int, default=100_000, help="parameters d of each client vector")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    parser.add_argument("--rss-clients", type=int, default=1000, help="clients of the memory runs (0: skip them)")
    parser.add_argument("--rss-methods", default=",".join(RSS_METHODS), help="methods of the memory runs")
    parser.add_argument("--threads", type=int, default=1, help="torch / BLAS threads (the engine's --threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result to this file")
    parser.add_argument("--rss-run", default=None, help=argparse.SUPPRESS)  # internal: one memory run
    parser.add_argument("--client-state", default="memory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rss_run:
        print(rss_run(args.rss_run, args.rss_clients, args.client_state, args.seed))
        return {}
    sizes = parse_sizes(args.sizes)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if args.dim < 1:
        raise SystemExit(f"--dim must be >= 1 (got {args.dim})")

    seconds: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    print(f"server work of one round, d = {args.dim:,}, threads = {args.threads} (wall s / CPU s)")
    print(f"{'method':<10}" + "".join(f"{f'n = {n:,}':>20}" for n in sizes))
    for method in methods:
        time_method(method, min(sizes), min(args.dim, 1000), args.seed)  # warm-up: imports, BLAS start
        seconds[method], cpu[method] = {}, {}
        cells = []
        for n in sizes:
            wall, used = time_method(method, n, args.dim, args.seed)
            seconds[method][str(n)], cpu[method][str(n)] = round(wall, 4), round(used, 4)
            cells.append(f"{wall:9.3f} / {used:7.3f}")
        print(f"{method:<10}" + "".join(f"{c:>20}" for c in cells), flush=True)

    result: dict = {"seconds": seconds, "cpu_seconds": cpu, "dim": args.dim, "threads": args.threads}
    if args.rss_clients > 0:
        by_run = {}
        print(f"\npeak RSS of one round with {args.rss_clients:,} clients (cnn-fmnist personal models), MB")
        for method in [m for m in args.rss_methods.split(",") if m]:
            for store in ("memory", "disk"):
                by_run[f"{method}/{store}"] = round(rss(method, args.rss_clients, store, args.seed), 1)
                print(f"{method:<10}{store:<8}{by_run[f'{method}/{store}']:>10.1f}", flush=True)
        result |= {"peak_rss_mb": max(by_run.values()), "peak_rss_mb_by_run": by_run, "rss_clients": args.rss_clients}
    else:
        result["peak_rss_mb"] = None
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
