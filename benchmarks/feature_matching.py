"""Cost of the federated-feature steps of PKCF (MuPFL) and CReFF as m grows.

Per m (features per class), on cnn-fmnist's classifier input (D = 3,136, C = 10), one thread:

- ``match step``: one SGD iteration of the server's feature matching as the library runs it
  (``FederatedFeatures.match``, closed-form gradient; 100 iterations a round);
- ``autograd step``: the same iteration by autograd through ``FederatedFeatures.loss`` (the
  reference the closed form is tested against, ``tests/test_creff.py``);
- ``tuning epoch``: one epoch of a client's classifier tuning on the features
  (``train_classifier``, batch 32; MuPFL runs τ = 50 a round and client).

Prints a Markdown table, then one JSON line.

    python benchmarks/feature_matching.py [--m 100 400 800] [--iterations 10] [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fedtail.algorithms.federated_features import FederatedFeatures, train_classifier

DIM, CLASSES = 3136, 10


def measure(m: int, iterations: int, epochs: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    features = FederatedFeatures(CLASSES, DIM, m, gen, lr=100.0, iterations=iterations, init_std=0.1)
    classifier = torch.nn.Linear(DIM, CLASSES)
    real = {"weight": torch.randn(CLASSES, CLASSES, DIM, generator=gen), "bias": torch.randn(CLASSES, CLASSES, generator=gen)}
    present = torch.ones(CLASSES, dtype=torch.bool)

    start = time.perf_counter()
    x = features.features.clone()
    for _ in range(iterations):
        x.requires_grad_(True)
        (grad,) = torch.autograd.grad(features.loss(classifier, real, present, x), x)
        x = (x - features.lr * grad).detach()
    autograd_ms = (time.perf_counter() - start) / iterations * 1000

    start = time.perf_counter()
    features.match(classifier, real, present)
    match_ms = (time.perf_counter() - start) / iterations * 1000

    start = time.perf_counter()
    train_classifier(classifier, features.features, features.labels, epochs=epochs, batch_size=32, lr=0.01, generator=gen)
    tune_ms = (time.perf_counter() - start) / epochs * 1000
    return {"m": m, "match_step_ms": round(match_ms, 1), "autograd_step_ms": round(autograd_ms, 1), "tuning_epoch_ms": round(tune_ms, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[100, 400, 800])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [measure(m, args.iterations, args.epochs) for m in args.m]
    print("| m | match step (ms) | autograd step (ms) | tuning epoch (ms) |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['m']} | {r['match_step_ms']} | {r['autograd_step_ms']} | {r['tuning_epoch_ms']} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
