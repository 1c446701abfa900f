"""Local training and evaluation loops over in-memory tensors, batched by index.

These are the hot path: no DataLoader, no per-batch allocation beyond the batch itself, and
evaluation under ``torch.inference_mode``. On a GPU the data, the index views and the model are on
the device (:mod:`fedtail.engine.device`): a batch is an index look-up there, the losses and counts
are summed there, and nothing crosses to the host per batch (one shuffle order per epoch goes to
the device: it is drawn on the CPU generator, so every device trains on the same batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fedtail import wire
from fedtail.algorithms.base import NO_HOOK, ExtraLoss, FeatureLoss, StepHook, class_counts, cross_entropy, shuffled  # noqa: F401
from fedtail.data.base import Dataset, Split



@dataclass
class TrainStats:
    """Totals of one local training pass, reported to the server as metrics.

    ``loss_sum`` is a float64 0-dim tensor on the training device once something was trained (summed
    there: adding float64 tensors gives the sum the host's floats would), read back once, by
    :attr:`loss` (so several passes of one task wait for the device once).
    """

    loss_sum: float | torch.Tensor = 0.0
    samples: int = 0
    steps: int = 0

    @property
    def loss(self) -> float:
        return float(self.loss_sum) / self.samples if self.samples else float("nan")

    def __iadd__(self, other: "TrainStats") -> "TrainStats":
        self.loss_sum = self.loss_sum + other.loss_sum
        self.samples += other.samples
        self.steps += other.steps
        return self

    def as_metrics(self) -> dict[str, float]:
        """The totals as reply metrics; ``train_loss`` only when something was trained (a NaN
        there means divergence to the engine, not "no training")."""
        loss = {wire.TRAIN_LOSS: self.loss} if self.samples else {}
        return loss | {wire.NUM_SAMPLES: float(self.samples), wire.NUM_STEPS: float(self.steps)}


def batches(index: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterable[torch.Tensor]:
    """One shuffled epoch of index batches (the last batch may be smaller), on ``index``'s device;
    the order is drawn on ``generator``'s device (the CPU: every device shuffles alike)."""
    return shuffled(index, generator).split(batch_size)


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    index: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    grad_clip: float | None = None,
    params: list[nn.Parameter] | None = None,
    steps: int | None = None,
    hook: StepHook | None = None,
    labels: torch.Tensor | None = None,
) -> TrainStats:
    """SGD epochs over ``dataset.train[index]``; the loss is taken from the training pass itself.

    With ``steps``, exactly that many batches instead of ``epochs`` (reshuffled at every pass
    over the data), as FedAC's "local iterations" are single batches. ``hook``: what the
    algorithm adds to each step (:class:`StepHook`). ``labels``: a segmentation client's label
    table (:meth:`~fedtail.data.base.Dataset.label_table`); the loss is then the mean per-pixel
    cross-entropy over the pixels not ignored, and the samples counted are images.
    """
    stats = TrainStats()
    if len(index) == 0:
        return stats
    hook = NO_HOOK if hook is None else hook
    split_forward = hook.features
    model.train()
    clip_params = params if params is not None else [p for g in optimizer.param_groups for p in g["params"]]
    split = dataset.train
    # Summed on the device in float64: the same sum, bit for bit, as adding float(loss) * n on the host.
    loss_sum = torch.zeros((), dtype=torch.float64, device=index.device)
    for epoch, batch in _schedule(index, batch_size, generator, epochs, steps):
        if epoch is not None:
            hook.before_epoch(epoch)
        x, y = dataset.batch(split, batch, labels)
        if split_forward:
            features = model.features(x)
            logits = model.head(features)
        else:
            features, logits = None, model(x)
        loss = cross_entropy(logits, y)
        extra = hook.loss(model, x, y, logits, features)
        total = loss if extra is None else loss + extra
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(clip_params, grad_clip)
        optimizer.step()
        n = len(batch)
        value = loss.detach()
        hook.after_step(value)
        loss_sum += value.double() * n
        stats.samples += n
        stats.steps += 1
    stats.loss_sum = loss_sum
    return stats


def _schedule(
    index: torch.Tensor, batch_size: int, generator: torch.Generator, epochs: int, steps: int | None
) -> Iterable[tuple[int | None, torch.Tensor]]:
    """The batches of one local training pass: ``epochs`` epochs, or exactly ``steps`` batches; each
    with the number of the pass over the data it starts (None for the batches after its first)."""
    if steps is None:
        for epoch in range(epochs):
            for i, batch in enumerate(batches(index, batch_size, generator)):
                yield (epoch if i == 0 else None), batch
        return
    done, epoch = 0, 0
    while done < steps:
        for i, batch in enumerate(batches(index, batch_size, generator)):
            yield (epoch if i == 0 else None), batch
            done += 1
            if done == steps:
                return
        epoch += 1


# predict(x) -> scores (a tensor), or several named scores of one pass ({name: scores})
Predict = Callable[[torch.Tensor], "torch.Tensor | dict[str, torch.Tensor]"]


@dataclass
class EvalCounts:
    """Per-class correct and total counts (and summed loss) of one evaluation.

    ``named``: the correct counts of every named prediction of the pass (a ``predict`` that
    returns several scores); ``by_stage_*``: with evaluation groups (the stage of each sample),
    the same per (group, class).
    """

    correct: torch.Tensor
    total: torch.Tensor
    loss_sum: float
    by_stage_correct: torch.Tensor | None = None
    by_stage_total: torch.Tensor | None = None
    named: dict[str, torch.Tensor] = field(default_factory=dict)
    named_by_stage: dict[str, torch.Tensor] = field(default_factory=dict)
    # with probabilities=True: the summed softmax of the samples of each true class (classes ×
    # classes, float64) and the summed entropy of the predictions (nats)
    prob_sum: torch.Tensor | None = None
    entropy_sum: float | None = None
    # segmentation: the pixel confusion matrix (true class × predicted class, int64); ``correct``
    # and ``total`` are then its diagonal and row sums (pixels, not images)
    confusion: torch.Tensor | None = None

    @property
    def accuracy(self) -> float:
        n = int(self.total.sum())
        return float(self.correct.sum()) / n if n else float("nan")


def _evaluate_masks(
    model: nn.Module, dataset: Dataset, split: Split, index: torch.Tensor | None, num_classes: int,
    batch_size: int, labels: torch.Tensor | None,
) -> EvalCounts:
    """:func:`evaluate` of a segmentation model: the confusion matrix of its per-pixel argmax."""
    device = split.y.device
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    if index is None:
        index = torch.arange(len(split), device=device)
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(index), batch_size):
            x, y = dataset.batch(split, index[start : start + batch_size], labels)
            logits = model(x)
            loss_sum += cross_entropy(logits, y, reduction="sum").double()
            # ignored pixels count in one extra cell, dropped below: no boolean indexing, so no
            # device-to-host synchronisation per batch on a GPU
            cell = torch.where(y >= 0, y * num_classes + logits.argmax(dim=1), num_classes * num_classes)
            confusion += torch.bincount(cell.reshape(-1), minlength=num_classes * num_classes + 1)[:-1]
    model.train(was_training)
    matrix = confusion.view(num_classes, num_classes).cpu()
    return EvalCounts(matrix.diagonal().clone(), matrix.sum(dim=1), float(loss_sum), confusion=matrix)


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    split: Split,
    index: torch.Tensor | None,
    num_classes: int,
    batch_size: int = 128,  # measured: faster than larger batches for the CNNs on CPU
    predict: Predict | None = None,
    main: str | None = None,
    groups: torch.Tensor | None = None,
    num_groups: int = 0,
    probabilities: bool = False,
    labels: torch.Tensor | None = None,
) -> EvalCounts:
    """Accuracy counts of ``model`` (or of ``predict``, which maps inputs to logits/scores).

    The counts come back on the CPU (one copy per evaluation); the batches are made on ``split``'s
    device, which must be the model's.

    ``predict`` may return several named scores at once (one forward pass for several
    prediction rules): ``main`` names the one the counts (and the loss) are of, and every name
    gets its correct counts in ``named``. ``groups`` (aligned with ``index``, values below
    ``num_groups``) adds counts per group and class. ``probabilities`` adds the summed softmax per
    true class and the summed prediction entropy (``--class-probabilities``).

    Segmentation (masks in ``split.y``; ``labels``: the client's label table): every pixel not
    ignored is a sample, and the counts add the pixel confusion matrix (:attr:`EvalCounts.confusion`).
    """
    if split.y.dim() > 1:
        if groups is not None or probabilities or predict is not None:
            raise ValueError("segmentation evaluates the model's own masks: no stage groups, class "
                             "probabilities or other prediction rules")
        return _evaluate_masks(model, dataset, split, index, num_classes, batch_size, labels)
    device = split.y.device
    correct = torch.zeros(num_classes, dtype=torch.int64, device=device)
    total = torch.zeros(num_classes, dtype=torch.int64, device=device)
    size = num_groups * num_classes
    by_correct = torch.zeros(size, dtype=torch.int64, device=device) if groups is not None else None
    by_total = torch.zeros(size, dtype=torch.int64, device=device) if groups is not None else None
    named: dict[str, torch.Tensor] = {}
    named_by: dict[str, torch.Tensor] = {}
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # as the host's sum of float(...)
    prob_sum = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=device) if probabilities else None
    entropy_sum = torch.zeros((), dtype=torch.float64, device=device)
    if index is None:
        index = torch.arange(len(split), device=device)
    was_training = model.training
    model.eval()
    forward = predict or model
    with torch.inference_mode():
        for start in range(0, len(index), batch_size):
            x, y = dataset.batch(split, index[start : start + batch_size])
            out = forward(x)
            several = out if isinstance(out, dict) else {}
            if several and main not in several:
                raise ValueError(f"predict returned {sorted(several)}; main={main!r} must name one of them")
            scores = several[main] if several else out
            loss_sum += F.cross_entropy(scores, y, reduction="sum").double()
            if prob_sum is not None:
                logp = F.log_softmax(scores.double(), dim=1)
                prob_sum.index_add_(0, y, logp.exp())
                entropy_sum -= (logp.exp() * logp).sum()
            cell = None if groups is None else groups[start : start + batch_size] * num_classes + y
            total += class_counts(y, num_classes)
            if cell is not None:
                by_total += class_counts(cell, size)
            for name, s in [(None, scores), *several.items()]:
                hit = s.argmax(dim=1) == y
                counts = class_counts(y, num_classes, hit)
                by = None if cell is None else class_counts(cell, size, hit)
                if name is None:
                    correct += counts
                    if by is not None:
                        by_correct += by
                else:
                    named[name] = named.get(name, 0) + counts
                    if by is not None:
                        named_by[name] = named_by.get(name, 0) + by
    model.train(was_training)
    shape = (num_groups, num_classes)
    host = lambda t: None if t is None else t.cpu()  # noqa: E731 - one copy per evaluation
    return EvalCounts(
        host(correct),
        host(total),
        float(loss_sum),
        None if by_correct is None else host(by_correct.view(shape)),
        None if by_total is None else host(by_total.view(shape)),
        {k: host(v) for k, v in named.items()},
        {k: host(v.view(shape)) for k, v in named_by.items()},
        host(prob_sum),
        float(entropy_sum) if prob_sum is not None else None,
    )
