"""Federated features over several rounds: initial scale and matching lr (validation data only).

CReFF's code draws the federated features from N(0, 1) in the 256-d feature space of ResNet-8.
cnn-fmnist's classifier sees 3136-d features, more dimensions than there are features (10 classes
x 100), so a classifier re-trained on unit-variance noise plus a matched signal can separate the
features by their noise alone. This experiment runs CReFF's server loop for several rounds on
a fixed body and scores the re-trained classifier on held-out, class-balanced TRAINING samples:

- 500 training samples per class are held out (validation); the rest is cut to a long tail with
  IF 10 (as in the Table II runs) and trains cnn-fmnist for 2 epochs (an early FedAvg body);
- each round: per-class real gradients on 5,000 drawn long-tail samples, under the classifier the
  features are matched with (``creff``: the previous re-trained classifier, as CReFF; ``pkcf``:
  the body's own classifier, as MuPFL's server); 100 matching steps; a fresh classifier
  re-trained 300 epochs on the features (CReFF's settings);
- a setting's score is the mean validation accuracy of rounds 4-6 (later rounds, after the
  features have moved; the test split is never used).

Run: python benchmarks/mupfl/feature_init_validation.py   (writes the .json beside it)
"""

from __future__ import annotations

import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from fedtail.algorithms.federated_features import FederatedFeatures, class_gradients, reset_linear, train_classifier
from fedtail.data import load_dataset
from fedtail.engine.training import evaluate, train_epochs
from fedtail.models import build_model

ROUNDS = 6
SETTINGS = [  # (matching mode, init std, match lr)
    ("creff", 1.0, 10.0), ("creff", 1.0, 100.0),
    ("creff", 0.1, 10.0), ("creff", 0.1, 100.0),
    ("creff", 0.01, 10.0), ("creff", 0.01, 100.0),
    ("pkcf", 1.0, 100.0), ("pkcf", 0.1, 100.0), ("pkcf", 0.01, 10.0),
]


def split_indices(labels: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(long-tailed IF-10 training indices, balanced validation indices: 500 per class)."""
    train, val = [], []
    for c in range(10):
        pos = (labels == c).nonzero().flatten()
        pos = pos[torch.randperm(len(pos), generator=generator)]
        val.append(pos[:500])
        train.append(pos[500 : 500 + int((len(pos) - 500) * 10 ** (-c / 9))])
    train_index = torch.cat(train)
    return train_index[torch.randperm(len(train_index), generator=generator)], torch.cat(val)


def main() -> None:
    torch.set_num_threads(1)
    dataset = load_dataset("fmnist", None)
    train_index, val_index = split_indices(dataset.train.y, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model("cnn-fmnist", dataset.input_shape, dataset.num_classes).to_channels_last()
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    train_epochs(model, opt, dataset, train_index, epochs=2, batch_size=64, generator=torch.Generator().manual_seed(1))
    own = {k: v.clone() for k, v in model.classifier.state_dict().items()}
    results = {"own_classifier_val_acc": round(evaluate(model, dataset, dataset.train, val_index, 10).accuracy, 4)}
    print(results, flush=True)
    dim = model.classifier.in_features
    results["runs"] = []
    start = time.perf_counter()
    for mode, std, lr in SETTINGS:
        retrained = torch.nn.Linear(dim, 10)
        reset_linear(retrained, torch.Generator().manual_seed(9))  # θ^0
        feats = FederatedFeatures(10, dim, 100, torch.Generator().manual_seed(3), lr=lr, init_std=std)
        accs, losses = [], []
        for rnd in range(ROUNDS):
            if mode == "creff":
                model.classifier.load_state_dict(retrained.state_dict())
            draw = train_index[torch.randperm(len(train_index), generator=torch.Generator().manual_seed(rnd))[:5000]]
            real, present = class_gradients(model, dataset, draw, 10, torch.Generator().manual_seed(rnd))
            model.classifier.load_state_dict(own)
            before, after = feats.match(retrained if mode == "creff" else model.classifier, real, present)
            reset_linear(retrained, torch.Generator().manual_seed(100 + rnd))
            train_classifier(
                retrained, feats.features, feats.labels, epochs=300, batch_size=32, lr=0.01,
                generator=torch.Generator().manual_seed(5),
            )
            model.classifier.load_state_dict(retrained.state_dict())
            accs.append(round(evaluate(model, dataset, dataset.train, val_index, 10).accuracy, 4))
            model.classifier.load_state_dict(own)
            losses.append([round(before, 2), round(after, 2)])
        row = {
            "mode": mode, "init_std": std, "match_lr": lr, "val_acc_per_round": accs,
            "score_rounds_4_6": round(sum(accs[3:]) / len(accs[3:]), 4), "match_loss_per_round": losses,
            "feature_norm": round(float(feats.features.norm(dim=1).mean()), 2),
        }
        results["runs"].append(row)
        print(row, flush=True)
    results |= {
        "command": "python benchmarks/mupfl/feature_init_validation.py",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} 2 vCPU Intel Xeon, 24 GB, torch {torch.__version__}, 1 thread",
        "seconds": round(time.perf_counter() - start, 1),
    }
    Path(__file__).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
