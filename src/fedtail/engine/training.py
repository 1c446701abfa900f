"""Local training and evaluation loops over in-memory tensors, batched by index.

These are the hot path: no DataLoader, no per-batch allocation beyond the batch itself, and
evaluation under ``torch.inference_mode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fedtail.data.base import Dataset, Split

# extra_loss(model, x, y, logits) -> tensor added to the cross-entropy (FedProx, Ditto, ...)
ExtraLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# feature_loss(model, x, y, logits, features) -> extra loss that also needs the body's output
# (MOON, FedProto, FedPAC): the loop runs body and head apart, so no second forward is needed
FeatureLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# on_step(loss) is called after every optimizer step with the batch's cross-entropy (MuPFL's BAVD)
OnStep = Callable[[float], None]


@dataclass
class TrainStats:
    """Totals of one local training pass, reported to the server as metrics."""

    loss_sum: float = 0.0
    samples: int = 0
    steps: int = 0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")

    def __iadd__(self, other: "TrainStats") -> "TrainStats":
        self.loss_sum += other.loss_sum
        self.samples += other.samples
        self.steps += other.steps
        return self

    def as_metrics(self) -> dict[str, float]:
        """The totals as reply metrics; ``train_loss`` only when something was trained (a NaN
        there means divergence to the engine, not "no training")."""
        loss = {"train_loss": self.loss} if self.samples else {}
        return loss | {"num_samples": float(self.samples), "num_steps": float(self.steps)}


def batches(index: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterable[torch.Tensor]:
    """One shuffled epoch of index batches (the last batch may be smaller)."""
    order = index[torch.randperm(len(index), generator=generator)]
    return order.split(batch_size)


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    index: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    extra_loss: ExtraLoss | None = None,
    grad_clip: float | None = None,
    params: list[nn.Parameter] | None = None,
    on_step: OnStep | None = None,
    steps: int | None = None,
    feature_loss: FeatureLoss | None = None,
) -> TrainStats:
    """SGD epochs over ``dataset.train[index]``; the loss is taken from the training pass itself.

    With ``steps``, exactly that many batches instead of ``epochs`` (reshuffled at every pass
    over the data), as FedAC's "local iterations" are single batches.
    """
    stats = TrainStats()
    if len(index) == 0:
        return stats
    model.train()
    clip_params = params if params is not None else [p for g in optimizer.param_groups for p in g["params"]]
    split = dataset.train
    for batch in _schedule(index, batch_size, generator, epochs, steps):
        x, y = dataset.batch(split, batch)
        if feature_loss is None:
            logits = model(x)
        else:
            features = model.features(x)
            logits = model.head(features)
        loss = F.cross_entropy(logits, y)
        total = loss if extra_loss is None else loss + extra_loss(model, x, y, logits)
        if feature_loss is not None:
            total = total + feature_loss(model, x, y, logits, features)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(clip_params, grad_clip)
        optimizer.step()
        n = len(batch)
        value = float(loss.detach())
        if on_step is not None:
            on_step(value)
        stats.loss_sum += value * n
        stats.samples += n
        stats.steps += 1
    return stats


def _schedule(
    index: torch.Tensor, batch_size: int, generator: torch.Generator, epochs: int, steps: int | None
) -> Iterable[torch.Tensor]:
    """The batches of one local training pass: ``epochs`` epochs, or exactly ``steps`` batches."""
    if steps is None:
        for _ in range(epochs):
            yield from batches(index, batch_size, generator)
        return
    done = 0
    while done < steps:
        for batch in batches(index, batch_size, generator):
            yield batch
            done += 1
            if done == steps:
                return


@dataclass
class EvalCounts:
    """Per-class correct and total counts (and summed loss) of one evaluation."""

    correct: torch.Tensor
    total: torch.Tensor
    loss_sum: float

    @property
    def accuracy(self) -> float:
        n = int(self.total.sum())
        return float(self.correct.sum()) / n if n else float("nan")


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    split: Split,
    index: torch.Tensor | None,
    num_classes: int,
    batch_size: int = 128,  # measured: faster than larger batches for the CNNs on CPU
    predict: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> EvalCounts:
    """Accuracy counts of ``model`` (or of ``predict``, which maps inputs to logits/scores)."""
    correct = torch.zeros(num_classes, dtype=torch.int64)
    total = torch.zeros(num_classes, dtype=torch.int64)
    loss_sum = 0.0
    if index is None:
        index = torch.arange(len(split))
    was_training = model.training
    model.eval()
    forward = predict or model
    with torch.inference_mode():
        for batch in index.split(batch_size):
            x, y = dataset.batch(split, batch)
            scores = forward(x)
            loss_sum += float(F.cross_entropy(scores, y, reduction="sum"))
            hit = scores.argmax(dim=1) == y
            total += torch.bincount(y, minlength=num_classes)
            correct += torch.bincount(y[hit], minlength=num_classes)
    model.train(was_training)
    return EvalCounts(correct, total, loss_sum)
