"""Choose BAVD's open details on VALIDATION data, cheaply (MuPFL Eq. 6; see algorithms/mupfl/bavd.py).

The paper leaves open the sign convention of ψ, whether kept activations are rescaled like the
dropout BAVD replaces, which activations it follows, and (issue 16) what the map's threshold is
compared with (the map's own positions or each activation's value), whether the mask comes from
the accumulated map or the current batch, and the map's shape. A full 40-round run per choice is
beyond a quick look, so this proxy trains the local step alone: for each of ``--clients`` clients
of the Table II partition (α 0.5, IF 10, seed 0, 15 % of each client's training samples held out
as validation), one local round of the protocol (10 epochs, batch 64, lr 0.005) and then accuracy
on the client's held-out validation samples. The test split is never used.

Two starting points:

- ``--warm-rounds 0`` (the first experiment, ``bavd_validation.json``): the common initial model.
  This favoured BAVD (ψ reversed, rescaled, last activation: 80.6 % against 75.0 % without), but
  in the 40-round test runs BAVD lowered accuracy in every ablation pair: from a random
  initialisation one local round is far from the regime the runs spend most rounds in.
- ``--warm-rounds W`` (issue 16, ``bavd_validation_warm.json``): first W rounds of plain FedAvg
  at the protocol (10 clients per round, sampled as the runs sample them), then the local round of
  every variant starts from that global model, as a client's round does in the middle of a run.

Run: python benchmarks/mupfl/bavd_validation.py [--warm-rounds W] [--clients N] [--variants a,b,...]
(about 3.5 s per client-variant and 35 s per warm-up round on one core of the 2-core machine)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.mupfl.bavd import ActivationMaps
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.context import get_weights, initial_weights, load_weights
from fedtail.engine.simulation import sample_clients
from fedtail.engine.training import evaluate, train_epochs
from fedtail.models import build_model

# name -> ActivationMaps arguments (None: plain training). The first experiment's variants keep
# their names (sign, rescaling, layers; mask "map" from the accumulated C×H×W map).
OLD = {"plain": None} | {
    f"sign{s:+d}-{'rescale' if r else 'noscale'}-layers{''.join(map(str, layers))}": dict(psi_sign=s, rescale=r, layers=layers)
    for s in (1, -1)
    for r in (False, True)
    for layers in ([0, 1],)
} | {f"sign-1-rescale-layers{l}": dict(psi_sign=-1, rescale=True, layers=[l]) for l in (0, 1)}

# Issue 16's candidates, each one change from the current default (ψ −1, rescaled, last layer,
# map mask from the accumulated C×H×W map).
DEFAULT = dict(psi_sign=-1, rescale=True, layers=[-1])
NEW = {
    "plain": None,
    "map-acc (default)": DEFAULT,
    "map-acc-psi+1": DEFAULT | dict(psi_sign=1),
    "map-acc-noscale": DEFAULT | dict(rescale=False),
    "map-acc-hw": DEFAULT | dict(shape="hw"),
    "map-acc-hw-noscale": DEFAULT | dict(shape="hw", rescale=False),
    "map-batch": DEFAULT | dict(source="batch"),
    "map-batch-noscale": DEFAULT | dict(source="batch", rescale=False),
    "value-acc": DEFAULT | dict(mask="value"),
    "value-acc-noscale": DEFAULT | dict(mask="value", rescale=False),
    "value-batch": DEFAULT | dict(mask="value", source="batch"),
    "value-acc-both-layers": DEFAULT | dict(mask="value", layers=[0, 1]),
}


def local_round(model, init, dataset, index, spec, lr, generator) -> None:
    load_weights(model, init)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if spec is None:
        train_epochs(model, opt, dataset, index, epochs=10, batch_size=64, generator=generator)
        return
    spec = dict(spec)
    maps = ActivationMaps(spec.pop("layers"), float(spec.pop("psi_sign")), spec.pop("rescale"), **spec)
    with maps.attached(model):
        train_epochs(model, opt, dataset, index, epochs=10, batch_size=64, generator=generator, hook=maps.hook())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm-rounds", type=int, default=0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--variants", default=None, help="comma-separated names (default: all of the mode's)")
    parser.add_argument("--out", default=None, help="JSON file (default: bavd_validation[_warm].json beside this script)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = build_config(
        {
            "dataset": "fmnist",
            "model": "cnn-fmnist",
            "partition": {"scheme": "dirichlet", "num_clients": 50, "alpha": 0.5, "imbalance": 10, "val_fraction": 0.15},
            "train": {"local_epochs": 10, "batch_size": 64, "lr": 0.005, "lr_decay": 0.98343},
            "fraction": 0.2,
            "seed": 0,
        }
    )
    dataset, partition = prepare(config)
    model = build_model(config.model, dataset.input_shape, dataset.num_classes)
    start = time.perf_counter()

    weights = initial_weights(config, dataset)
    for rnd in range(1, args.warm_rounds + 1):  # plain FedAvg at the protocol
        mean = WeightedMean()
        for cid in sample_clients(config.seed, rnd, 50, config.clients_per_round):
            index = torch.as_tensor(partition.clients[cid].train)
            gen = torch.Generator().manual_seed(10_000 * rnd + cid)
            local_round(model, weights, dataset, index, None, config.train.lr_at(rnd), gen)
            mean.add(get_weights(model), len(index))
        weights = mean.result()
        print(f"warm-up round {rnd} done ({time.perf_counter() - start:.0f} s)", flush=True)
    lr = config.train.lr_at(args.warm_rounds + 1)

    table = OLD if args.warm_rounds == 0 and args.variants is None else NEW
    names = list(table) if args.variants is None else args.variants.split(",")
    specs = {name: (NEW | OLD)[name] for name in names}
    clients = list(range(0, 50, 50 // args.clients))[: args.clients]
    results: dict[str, list[float]] = {}
    for name, spec in specs.items():
        accs = []
        for cid in clients:
            data = partition.clients[cid]
            gen = torch.Generator().manual_seed(cid)
            local_round(model, weights, dataset, torch.as_tensor(data.train), spec, lr, gen)
            counts = evaluate(model, dataset, dataset.train, torch.as_tensor(data.val), dataset.num_classes)
            accs.append(counts.accuracy)
        results[name] = accs
        print(f"{name:28s} mean val acc {np.mean(accs):.4f}", flush=True)
    command = "python benchmarks/mupfl/bavd_validation.py" + "".join(
        f" {flag} {value}" for flag, value, default in (("--warm-rounds", args.warm_rounds, 0), ("--clients", args.clients, 10))
        if value != default
    ) + (f" --variants '{args.variants}'" if args.variants else "") + (f" --out {args.out}" if args.out else "")
    out = {
        "command": command,
        "date": date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread, torch {torch.__version__}",
        "python": sys.version.split()[0],
        "warm_rounds": args.warm_rounds,
        "clients": clients,
        "variants": {k: v for k, v in specs.items()},
        "seconds": round(time.perf_counter() - start, 1),
        "mean_val_accuracy": {k: round(float(np.mean(v)), 4) for k, v in results.items()},
        "per_client": {k: [round(a, 4) for a in v] for k, v in results.items()},
    }
    stem = "bavd_validation" if args.warm_rounds == 0 else "bavd_validation_warm"
    path = Path(args.out) if args.out else Path(__file__).with_name(stem + ".json")
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
