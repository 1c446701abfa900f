"""Per-class means of a model's outputs, their aggregation, and losses towards per-class targets.

FedProto and FedPAC exchange *prototypes* (the mean body feature of each class); FedDistill
exchanges mean *logits* per class. Both are the same computation on a different output of the
model, and both are averaged over clients class by class, so the pieces live here:

- :func:`class_statistics` / :class:`ClassStats`: per-class sums, counts and squared norms of the
  features or logits of a client's training data, in inference mode;
- :class:`ClassMean`: the server's per-class mean of the clients' class means, weighted by the
  clients' class counts or uniform over the clients holding the class;
- :func:`class_target_loss`: the regulariser pulling each sample's output towards the target of
  its label (global prototype, global logits), zero for labels without a target;
- :func:`nearest_prototype_scores`: FedProto's prediction by the nearest prototype.

Absent classes are carried as zero rows with count 0 (client → server) or ``present = False``
(server → client), so every payload has a fixed shape ``(C, d)``.

Missing replies: a server's :class:`ClassMean` runs over the replies that arrived, so a class is
"held" only by the replying clients; what a method does with a class none of them holds is the
method's choice (see its module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from fedtail.algorithms.aggregate import active_rule, per_class
from fedtail.algorithms.base import class_counts

if TYPE_CHECKING:
    from torch import nn

    from fedtail.data.base import Dataset
    from fedtail.engine.training import FeatureLoss

Output = Literal["features", "logits"]
Weighting = Literal["weighted", "uniform"]
Alignment = Literal["mse", "l2sq"]


@dataclass
class ClassStats:
    """Running per-class totals of output vectors: sums (C, d), counts (C,), Σ‖v‖² (C,).

    Accumulated in float64 so a client's means do not depend on how its data is batched.
    """

    sums: torch.Tensor
    counts: torch.Tensor
    sq_norms: torch.Tensor

    @classmethod
    def zeros(cls, num_classes: int, dim: int, device: torch.device) -> "ClassStats":
        return cls(
            torch.zeros(num_classes, dim, dtype=torch.float64, device=device),
            torch.zeros(num_classes, dtype=torch.int64, device=device),
            torch.zeros(num_classes, dtype=torch.float64, device=device),
        )

    def add(self, values: torch.Tensor, labels: torch.Tensor) -> None:
        v = values.detach().to(torch.float64)
        self.sums.index_add_(0, labels, v)
        self.counts += class_counts(labels, len(self.counts))
        self.sq_norms.index_add_(0, labels, v.pow(2).sum(1))

    @property
    def present(self) -> torch.Tensor:
        return self.counts > 0

    @property
    def means(self) -> torch.Tensor:
        """Float32 per-class means; zero rows for classes without samples."""
        return (self.sums / self.counts.clamp(min=1).unsqueeze(1)).to(torch.float32)


def class_statistics(
    model: nn.Module,
    dataset: Dataset,
    index: torch.Tensor,
    num_classes: int,
    output: Output = "features",
    batch_size: int = 128,
) -> ClassStats:
    """Per-class statistics of ``model``'s body features (or logits) on ``dataset.train[index]``.

    Runs in eval mode under ``torch.inference_mode`` (no dropout, BatchNorm running statistics
    untouched), restoring the model's mode afterwards. ``model`` must be a SplitModel.
    """
    dim = model.feature_dim if output == "features" else model.num_classes
    stats = ClassStats.zeros(num_classes, dim, index.device)
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for batch in index.split(batch_size):
            x, y = dataset.batch(dataset.train, batch)
            values = model.features(x) if output == "features" else model(x)
            stats.add(values, y)
    model.train(was_training)
    return stats


class ClassMean:
    """Per-class mean of clients' class means over the clients that hold the class.

    ``weighted``: client k's mean of class c counts with its number of samples n_k^c, giving
    Σ_k n_k^c m_k^c / Σ_k n_k^c (the mean over the pooled samples); ``uniform``: every holder
    counts once, Σ_{k: n_k^c > 0} m_k^c / |{k: n_k^c > 0}|. Under the run's robust rule (made
    during a round, ``--aggregate``): the rule per class over its holders, unweighted
    (:func:`~fedtail.algorithms.aggregate.per_class`); ``plain``: always the mean.
    """

    def __init__(self, weighting: Weighting = "weighted", plain: bool = False) -> None:
        if weighting not in ("weighted", "uniform"):
            raise ValueError(f"unknown weighting {weighting!r}")
        self.weighting = weighting
        self.rule = active_rule(plain)
        self.inputs: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []  # a robust rule's buffer
        self.sums: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None

    def add(self, means: torch.Tensor, counts: torch.Tensor) -> None:
        if self.rule.kind != "mean":
            self.inputs.append(({"m": means.detach()}, counts > 0))
            return
        w = counts.to(torch.float64) if self.weighting == "weighted" else (counts > 0).to(torch.float64)
        term = means.detach().to(torch.float64) * w.unsqueeze(1)
        if self.sums is None:
            self.sums, self.weights = term, w
        else:
            self.sums += term
            self.weights += w

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 global means (zero rows where no client holds the class) and the present mask."""
        if self.inputs:
            means, present = per_class(self.rule, self.inputs)
            return means["m"].to(torch.float32), present.to(means["m"].device)
        if self.sums is None or self.weights is None:
            raise ValueError("class mean of nothing (no clients)")
        present = self.weights > 0
        means = self.sums / self.weights.clamp(min=1e-300).unsqueeze(1)
        means[~present] = 0
        return means.to(torch.float32), present


def class_target_loss(
    outputs: torch.Tensor,
    labels: torch.Tensor,
    targets: torch.Tensor,
    present: torch.Tensor,
    alignment: Alignment = "mse",
) -> torch.Tensor:
    """Distance of each output to the target of its label; samples whose label has no target add 0.

    ``mse``: Σ_i Σ_d (v_id − t_{y_i,d})² / (B·D), PyTorch's MSELoss over the batch with a
    sample's own (detached) output as the target where its label has none (FedProto's and
    FedPAC's code); ``l2sq``: Σ_i ‖v_i − t_{y_i}‖² / B, the mean squared L2 distance as the
    papers write R(·).
    """
    mask = present[labels].to(outputs.dtype).unsqueeze(1)
    sq = (outputs - targets[labels]).pow(2) * mask
    if alignment == "mse":
        return sq.sum() / outputs.numel()
    if alignment == "l2sq":
        return sq.sum() / outputs.shape[0]
    raise ValueError(f"unknown alignment {alignment!r}")


def alignment_loss(targets: torch.Tensor, present: torch.Tensor, coef: float, alignment: Alignment) -> FeatureLoss:
    """``coef`` · :func:`class_target_loss` of the body features, for ``ctx.train(hook=FeatureTerm(...))``."""

    def term(
        model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        return coef * class_target_loss(features, y, targets, present, alignment)

    return term


def nearest_prototype_scores(features: torch.Tensor, protos: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Scores ``−‖f − C_j‖² / d`` per class, so argmax is the nearest prototype in L2.

    Classes without a prototype get a score one below the row's lowest, so they never win and
    the evaluation's cross-entropy stays finite.
    """
    d2 = (features.unsqueeze(1) - protos.unsqueeze(0)).pow(2).mean(2)
    scores = -d2
    # no test of present.all() (a wait for the device per batch): where() keeps every present score as it is
    floor = scores.masked_fill(~present.unsqueeze(0), float("inf")).min(dim=1, keepdim=True).values - 1
    return torch.where(present.unsqueeze(0), scores, floor)
