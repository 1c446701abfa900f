"""Choose BAVD's open details (ψ sign, rescaling, layers) on VALIDATION data, cheaply.

The paper leaves open the sign convention of ψ, whether kept activations are rescaled like the
dropout BAVD replaces, and which activations it follows. A full 40-round run per choice is
beyond our compute, so this proxy trains the local step alone: for each of 10 clients of the
Table II partition (α 0.5, IF 10, seed 0, 15 % of each client's training samples held out as
validation), one local round of the protocol (10 epochs, batch 64, lr 0.005) from the common
initial model, then accuracy on the client's held-out validation samples. The test split is
never used. Writes benchmarks/mupfl/bavd_validation.json.

Run: python benchmarks/mupfl/bavd_validation.py
"""

from __future__ import annotations

import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

from fedtail.algorithms.mupfl.bavd import ActivationMaps
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.context import initial_weights, load_weights
from fedtail.engine.training import evaluate, train_epochs
from fedtail.models import build_model

CLIENTS = 10
VARIANTS = [("plain", None)] + [
    (f"sign{s:+d}-{'rescale' if r else 'noscale'}-layers{''.join(map(str, layers))}", (s, r, layers))
    for s in (1, -1)
    for r in (False, True)
    for layers in ([0, 1],)
] + [(f"sign-1-rescale-layers{l}", (-1, True, [l])) for l in (0, 1)]


def main() -> None:
    torch.set_num_threads(1)
    config = build_config(
        {
            "dataset": "fmnist",
            "model": "cnn-fmnist",
            "partition": {"scheme": "dirichlet", "num_clients": 50, "alpha": 0.5, "imbalance": 10, "val_fraction": 0.15},
            "train": {"local_epochs": 10, "batch_size": 64, "lr": 0.005},
            "seed": 0,
        }
    )
    dataset, partition = prepare(config)
    init = initial_weights(config, dataset)
    model = build_model(config.model, dataset.input_shape, dataset.num_classes)
    clients = list(range(0, 50, 50 // CLIENTS))[:CLIENTS]
    results: dict[str, list[float]] = {}
    start = time.perf_counter()
    for name, spec in VARIANTS:
        accs = []
        for cid in clients:
            data = partition.clients[cid]
            load_weights(model, init)
            opt = torch.optim.SGD(model.parameters(), lr=config.train.lr)
            gen = torch.Generator().manual_seed(cid)
            train_index = torch.as_tensor(data.train)
            if spec is None:
                train_epochs(model, opt, dataset, train_index, epochs=10, batch_size=64, generator=gen)
            else:
                sign, rescale, layers = spec
                maps = ActivationMaps(layers, float(sign), rescale)
                with maps.attached(model):
                    train_epochs(
                        model, opt, dataset, train_index, epochs=10, batch_size=64, generator=gen, on_step=maps.on_step
                    )
            counts = evaluate(model, dataset, dataset.train, torch.as_tensor(data.val), dataset.num_classes)
            accs.append(counts.accuracy)
        results[name] = accs
        print(f"{name:32s} mean val acc {np.mean(accs):.4f}", flush=True)
    out = {
        "command": "python benchmarks/mupfl/bavd_validation.py",
        "date": date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread, torch {torch.__version__}",
        "python": sys.version.split()[0],
        "clients": clients,
        "seconds": round(time.perf_counter() - start, 1),
        "mean_val_accuracy": {k: round(float(np.mean(v)), 4) for k, v in results.items()},
        "per_client": {k: [round(a, 4) for a in v] for k, v in results.items()},
    }
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
