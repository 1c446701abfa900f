"""How fast federated-feature matching converges on cnn-fmnist features, per matching lr (validation).

CReFF's code matches 256-dimensional ResNet-8 features with SGD at lr 0.1; cnn-fmnist's classifier
sees 3136-dimensional features, where the same lr barely moves the loss within a round. This
trains cnn-fmnist briefly on long-tailed Fashion-MNIST TRAINING samples, takes per-class real
classifier gradients on them, matches 100 features per class for 100 and 400 iterations at
several learning rates, re-trains a fresh classifier on the features (CReFF's 300 epochs) and
scores it on held-out TRAINING samples (validation; the test split is never used).

Run: python benchmarks/mupfl/feature_matching_validation.py   (writes the .json beside it)
"""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

import torch

from fedtail.algorithms.federated_features import FederatedFeatures, class_gradients, reset_linear, train_classifier
from fedtail.data import load_dataset
from fedtail.engine.training import evaluate, train_epochs
from fedtail.models import build_model


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = load_dataset("fmnist", None)
    order = torch.randperm(len(dataset.train), generator=torch.Generator().manual_seed(0))
    train_index, val_index = order[:6000], order[6000:9000]
    model = build_model("cnn-fmnist", dataset.input_shape, dataset.num_classes).to_channels_last()
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    train_epochs(model, opt, dataset, train_index, epochs=3, batch_size=64, generator=torch.Generator().manual_seed(1))
    base = evaluate(model, dataset, dataset.train, val_index, 10).accuracy
    real, present = class_gradients(model, dataset, train_index, 10, torch.Generator().manual_seed(2))
    results = {"trained_model_val_acc": round(base, 4), "runs": []}
    start = time.perf_counter()
    for lr in (0.1, 1.0, 10.0, 100.0):
        for iterations in (100, 400):
            feats = FederatedFeatures(10, model.classifier.in_features, 100, torch.Generator().manual_seed(3), lr=lr, iterations=iterations)
            before, after = feats.match(model.classifier, real, present)
            fresh = torch.nn.Linear(model.classifier.in_features, 10)
            reset_linear(fresh, torch.Generator().manual_seed(4))
            train_classifier(fresh, feats.features, feats.labels, epochs=300, batch_size=32, lr=0.01, generator=torch.Generator().manual_seed(5))
            saved = {k: v.clone() for k, v in model.classifier.state_dict().items()}
            model.classifier.load_state_dict(fresh.state_dict())
            acc = evaluate(model, dataset, dataset.train, val_index, 10).accuracy
            model.classifier.load_state_dict(saved)
            row = {"match_lr": lr, "iterations": iterations, "loss_before": round(before, 2), "loss_after": round(after, 2), "retrained_val_acc": round(acc, 4)}
            results["runs"].append(row)
            print(row, flush=True)
    results |= {
        "command": "python benchmarks/mupfl/feature_matching_validation.py",
        "date": date.today().isoformat(),
        "machine": "2 vCPU Intel Xeon, 24 GB, torch " + torch.__version__ + ", 1 thread",
        "seconds": round(time.perf_counter() - start, 1),
    }
    Path(__file__).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
