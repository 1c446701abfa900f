"""Seconds per local training step of `convnet` and `convnet-wide` on Fashion-MNIST.

One step is what a client of FedAC's protocol does five times a round (batch 32, SGD lr 0.01):
a batch drawn from the Fashion-MNIST training split, normalised, forward, backward, update,
through the engine's own loop (`engine.training.train_epochs`) with the run defaults (one
intra-op thread, channels-last weights). Each model is timed plainly and with FedAC's two pulls
(μ 0.01 to a cluster centre, λ 0.1 to the global embedding: an extra loss over every parameter).
The models alternate over the repeats, so load from other processes hits both alike; the best
repeat counts. Prints one JSON line, with the cost of FedAC's protocol (1000 rounds × 25 clients
× 5 steps) in client steps alone: no evaluation, server work or messaging.

Run: PYTHONPATH=src python benchmarks/model_size.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date

import torch

from fedtail.algorithms.fedac import regularizer
from fedtail.data import load_dataset
from fedtail.engine.training import train_epochs
from fedtail.models import build_model
from fedtail.machine import describe, machine_info

MODELS = {"convnet": 300, "convnet-wide": 40}  # steps per timing (about 1–3 s each)
PROTOCOL_STEPS = 1000 * 25 * 5  # FedAC, Sec. 5.1: rounds × clients per round × local iterations


def seconds_per_step(model, dataset, steps: int, pulls: bool, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(len(dataset.train.y), generator=generator)[:350]  # one client's worth at most
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = None
    if pulls:  # anchors a little off the model, as a cluster centre and Φ would be
        anchor = {k: v.detach() + 0.01 for k, v in model.state_dict().items()}
        extra = regularizer(model, anchor, {k: v for k, v in anchor.items() if k.startswith("body.")}, 0.01, 0.1)

    def run(n: int) -> None:
        train_epochs(
            model, optimizer, dataset, index, epochs=1, steps=n, batch_size=32, generator=generator, extra_loss=extra
        )

    run(3)  # warm-up
    start = time.perf_counter()
    run(steps)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = load_dataset("fmnist")
    times: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.repeats):
        for name, steps in MODELS.items():
            for pulls in (False, True):
                torch.manual_seed(0)
                model = build_model(name, dataset.input_shape, dataset.num_classes).to_channels_last()
                times.setdefault((name, pulls), []).append(seconds_per_step(model, dataset, steps, pulls, r))
    out = {}
    for name in MODELS:
        model = build_model(name, dataset.input_shape, dataset.num_classes)
        params = sum(p.numel() for p in model.parameters())
        plain, pulled = min(times[(name, False)]), min(times[(name, True)])
        out[name] = {
            "parameters": params,
            "model_mb": round(params * 4 / 1e6, 2),  # float32, one upload
            "s_per_step": round(plain, 5),
            "s_per_step_fedac_pulls": round(pulled, 5),
            "protocol_client_hours": round(plain * PROTOCOL_STEPS / 3600, 2),
            "protocol_client_hours_fedac": round(pulled * PROTOCOL_STEPS / 3600, 2),
        }
    print(
        json.dumps(
            {
                "load_1min_at_end": round(os.getloadavg()[0], 2),  # other processes slow the steps down
                "date": date.today().isoformat(),
                "machine": describe(machine_info()),
                "torch": torch.__version__,
                "threads": 1,
                "batch": 32,
                "dataset": "fmnist",
                "best_of": args.repeats,
                "protocol_steps": PROTOCOL_STEPS,
                "models": out,
            }
        )
    )


if __name__ == "__main__":
    main()
