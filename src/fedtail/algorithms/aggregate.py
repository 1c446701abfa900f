"""Aggregation helpers shared by the algorithms.

Missing replies: the engine ends a round when an exchange gets no reply, so a mean over one
exchange's replies is never empty; a mean per cluster or group must be created when a member's
reply arrives, not for every member messaged (one nobody replied to would be a mean of nothing).
"""

from __future__ import annotations

from typing import Iterable

import torch

from fedtail.algorithms.base import Tensors


class WeightedMean:
    """Streaming weighted mean of named tensors: one running sum, whatever the client count.

    Accumulates in float64 so the result does not depend on how many clients are summed
    before rounding; integer tensors (BatchNorm's ``num_batches_tracked``) are averaged too
    and cast back.
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.total = 0.0

    def add(self, tensors: Tensors, weight: float) -> None:
        if weight < 0:
            raise ValueError(f"aggregation weight must be >= 0 (got {weight})")
        if not self.sums:
            for name, value in tensors.items():
                self.sums[name] = value.detach().to(torch.float64) * weight
                self.dtypes[name] = value.dtype
        else:
            if tensors.keys() != self.sums.keys():
                raise KeyError("clients sent different tensor names to one aggregate")
            for name, value in tensors.items():
                self.sums[name].add_(value.detach().to(torch.float64), alpha=weight)
        self.total += weight

    def result(self) -> Tensors:
        if self.total <= 0:
            raise ValueError("weighted mean of nothing (no clients, or all weights zero)")
        out = {}
        for name, value in self.sums.items():
            mean = value / self.total
            dtype = self.dtypes[name]
            out[name] = (mean.round() if not dtype.is_floating_point else mean).to(dtype)
        return out


def weighted_mean(items: Iterable[tuple[Tensors, float]]) -> Tensors:
    """``Σ w_k x_k / Σ w_k`` over (tensors, weight) pairs."""
    acc = WeightedMean()
    for tensors, weight in items:
        acc.add(tensors, weight)
    return acc.result()
