"""Throughput of the simulation engine against a bare centralised training loop.

Runs FedAvg on long-tailed Fashion-MNIST (serial, then ``--workers 2``) and, in the same
process, a bare loop with the same model, batch size and intra-op thread count over the same
number of samples. The last line printed is JSON:

    fl_samples_per_s, bare_samples_per_s, efficiency_serial (FL / bare),
    efficiency_parallel (the --workers 2 run over the same bare figure)

FL time is the wall time of the rounds (client training, messaging, aggregation); the final
evaluation and the one-off worker start-up are timed and printed separately.

    python benchmarks/throughput.py [--rounds 5] [--local-epochs 2] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
import torch.nn.functional as F

from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.simulation import Simulation
from fedtail.models import build_model


def fl_config(args: argparse.Namespace, workers: int):
    return build_config(
        {
            "algorithm": "fedavg",
            "dataset": "fmnist",
            "model": "cnn-fmnist",
            "partition": {"scheme": "dirichlet", "alpha": 0.5, "imbalance": 10, "num_clients": 50},
            "train": {"local_epochs": args.local_epochs, "batch_size": args.batch_size, "lr": 0.005},
            "fraction": 0.2,
            "rounds": args.rounds,
            "eval_every": 10_000,  # only the final evaluation
            "workers": workers,
            "threads": args.threads,
            "seed": 0,
        }
    )


def fl_run(args: argparse.Namespace, workers: int, dataset, partition) -> dict:
    config = fl_config(args, workers)
    start = time.perf_counter()
    sim = Simulation(config, dataset, partition)
    setup = time.perf_counter() - start
    summary = sim.run()
    train_time = summary["wall_time_s"] - summary["time_s"]["evaluation"]
    return {
        "workers": workers,
        "samples": summary["samples_trained"],
        "train_time_s": train_time,
        "eval_time_s": summary["time_s"]["evaluation"],
        "setup_time_s": setup,
        "samples_per_s": summary["samples_trained"] / train_time,
        "final_personalized_acc": summary["final"]["personalized_acc"],
    }


def bare_run(dataset, index: torch.Tensor, samples: int, batch_size: int, threads: int) -> float:
    """A plain centralised SGD loop with the same model, layout, batch size and threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model("cnn-fmnist", dataset.input_shape, dataset.num_classes).to_channels_last()
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    g = torch.Generator().manual_seed(0)
    model.train()
    done = 0
    start = time.perf_counter()
    while done < samples:
        order = index[torch.randperm(len(index), generator=g)]
        for batch in order.split(batch_size):
            x, y = dataset.batch(dataset.train, batch)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += len(batch)
            if done >= samples:
                break
    return done / (time.perf_counter() - start)


def _expected_samples(args: argparse.Namespace, partition) -> int:
    """Samples the FL run will train (for the first bare run, before the FL run has happened)."""
    sizes = [len(c.train) for c in partition.clients]
    return int(sum(sizes) / len(sizes) * round(0.2 * len(sizes)) * args.local_epochs * args.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    # One-off process costs (lazy imports inside torch on the first optimizer step) are paid
    # before anything is timed, so both sides are measured in steady state.
    dataset, partition = prepare(fl_config(args, 1))
    index = torch.as_tensor(partition.kept, dtype=torch.int64)
    bare_run(dataset, index, 3 * args.batch_size, args.batch_size, args.threads)

    # The bare loop runs before and after the serial FL run; their mean absorbs machine drift.
    bare = [bare_run(dataset, index, _expected_samples(args, partition), args.batch_size, args.threads)]
    serial = fl_run(args, 1, dataset, partition)
    bare.append(bare_run(dataset, index, serial["samples"], args.batch_size, args.threads))
    print(f"FL serial   : {serial['samples']} samples in {serial['train_time_s']:.1f} s "
          f"= {serial['samples_per_s']:.0f}/s (final eval {serial['eval_time_s']:.1f} s)")
    print(f"bare loop   : {bare[0]:.0f}/s before, {bare[1]:.0f}/s after ({args.threads} thread(s), batch {args.batch_size})")
    parallel = fl_run(args, args.workers, dataset, partition)
    print(f"FL workers={args.workers}: {parallel['samples']} samples in {parallel['train_time_s']:.1f} s "
          f"= {parallel['samples_per_s']:.0f}/s (worker start-up {parallel['setup_time_s']:.1f} s)")
    assert parallel["final_personalized_acc"] == serial["final_personalized_acc"], "serial and parallel disagree"
    bare_mean = sum(bare) / len(bare)
    result = {
        "fl_samples_per_s": round(serial["samples_per_s"], 1),
        "fl_parallel_samples_per_s": round(parallel["samples_per_s"], 1),
        "bare_samples_per_s": round(bare_mean, 1),
        "bare_runs_samples_per_s": [round(b, 1) for b in bare],
        "efficiency_serial": round(serial["samples_per_s"] / bare_mean, 3),
        "efficiency_parallel": round(parallel["samples_per_s"] / bare_mean, 3),
        "workers": args.workers,
        "threads": args.threads,
        "samples": serial["samples"],
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
