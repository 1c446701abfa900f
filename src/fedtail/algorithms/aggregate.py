"""Aggregation helpers shared by the algorithms, and the run's aggregation rule.

Missing replies: the engine ends a round when an exchange gets no reply, so a mean over one
exchange's replies is never empty; a mean per cluster or group must be created when a member's
reply arrives, not for every member messaged (one nobody replied to would be a mean of nothing).

The run's rule (``--aggregate``, client-level DP's noise: :mod:`fedtail.engine.guard`) is set by the
engine around each round of the server half (:func:`aggregation`); every :class:`WeightedMean` made
during the round takes it, so an algorithm averages as it always did and the run decides how:

- ``mean``: the weighted mean, streaming (one running sum).
- ``median``: the coordinate-wise median (Yin et al., ICML 2018; the mean of the two middle values
  for an even count), unweighted.
- ``trimmed:F``: per coordinate, the F largest and F smallest values dropped, the rest averaged
  unweighted (Yin et al. 2018's trimmed mean); needs 2F + 1 inputs.
- ``krum:F`` / ``krum:F:M``: Krum (Blanchard et al., NeurIPS 2017): each input scored by the summed
  squared L2 distances to its n − F − 2 nearest others (over every floating tensor at once), the
  lowest-scored one taken; with M, multi-Krum: the unweighted mean of the M lowest-scored
  (Blanchard et al.'s (1/M)·Σ; a weight is a sample count the client reports); needs 2F + 3 inputs.
  Krum chooses per mean (and per class, below): a method that averages two groups of tensors
  apart (GLDP's shared body and its classifiers) may take them from different clients.

The robust rules are translation-equivariant, so applied to uploaded models they equal the rule
applied to the updates plus the model sent. They buffer the inputs (n copies of the upload).
Integer tensors (BatchNorm's ``num_batches_tracked``) take the rule too and are rounded back.
Median, trimmed mean and Krum are unweighted (a reply of a client without training samples, the
model it was sent, counts as one input, where the mean gives it weight 0).
With client-level DP (``noise``), the mean is unweighted (a weight would scale one client's
sensitivity) and Gaussian noise of standard deviation σ is added to the sum of the n inputs before
dividing by n: with every input the model sent plus a clipped update, that is the sum of the updates
plus noise (DP-FedAvg, McMahan et al., ICLR 2018).

A mean of per-class statistics, not of models (prototypes, CReFF's gradients), uses
:class:`~fedtail.algorithms.prototypes.ClassMean` or
:class:`~fedtail.algorithms.federated_features.ClassGradientMean`; under a robust rule they apply it
class by class over the class's holders (:func:`per_class`), and a class with fewer holders than
the rule needs is left out of the round. ``WeightedMean(plain=True)`` is a mean the rule does not
touch (an algorithm's server-side combination of its own models).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from fedtail.algorithms.base import Tensors

RULES = "mean | median | trimmed:F | krum:F | krum:F:M"
# why a clustered method does not take a robust rule (Algorithm.robust)
PER_CLUSTER = "averages per cluster, whose members change by round: F faulty among each cluster cannot be assumed"


@dataclass(frozen=True)
class Rule:
    """An aggregation rule (module docstring); ``Rule.parse("trimmed:2")``."""

    kind: str = "mean"
    f: int = 0  # inputs assumed faulty (trimmed: dropped on each side)
    m: int = 1  # krum: inputs averaged (1: Krum, > 1: multi-Krum)

    @classmethod
    def parse(cls, text: str) -> "Rule":
        spec = str(text).strip().lower()
        if spec in ("mean", "median"):
            return cls(spec)
        found = re.fullmatch(r"(trimmed|krum):(\d+)(?::(\d+))?", spec)
        if not found or (found.group(1) == "trimmed" and found.group(3) is not None):
            raise ValueError(f"--aggregate takes {RULES} (got {text!r})")
        kind, f, m = found.group(1), int(found.group(2)), int(found.group(3) or 1)
        if kind == "trimmed" and f < 1:
            raise ValueError(f"--aggregate {text}: trimmed needs F >= 1 (trimmed:0 is the unweighted mean)")
        if m < 1:
            raise ValueError(f"--aggregate {text}: multi-Krum needs M >= 1")
        return cls(kind, f, m)

    @property
    def min_inputs(self) -> int:
        """The fewest inputs the rule is defined for."""
        if self.kind == "trimmed":
            return 2 * self.f + 1
        if self.kind == "krum":
            return max(2 * self.f + 3, self.m)
        return 1

    def __str__(self) -> str:
        if self.kind == "trimmed":
            return f"trimmed:{self.f}"
        if self.kind == "krum":
            return f"krum:{self.f}" + (f":{self.m}" if self.m > 1 else "")
        return self.kind


@dataclass(frozen=True)
class Noise:
    """Client-level DP on a mean: N(0, std²) added to the sum, drawn from ``generator``."""

    std: float
    generator: torch.Generator


MEAN = Rule()
_ACTIVE: contextvars.ContextVar[tuple[Rule, Noise | None]] = contextvars.ContextVar("fedtail_aggregation", default=(MEAN, None))


@contextlib.contextmanager
def aggregation(rule: Rule, noise: Noise | None = None) -> Iterator[None]:
    """Every :class:`WeightedMean` made inside takes ``rule`` (and ``noise``): the engine's round."""
    token = _ACTIVE.set((rule, noise))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _combine(rule: Rule, inputs: list[Tensors]) -> dict[str, torch.Tensor]:
    """The robust rule over buffered inputs, in float64."""
    n = len(inputs)
    if n < rule.min_inputs:
        raise ValueError(f"--aggregate {rule} needs at least {rule.min_inputs} inputs to one mean (got {n})")
    names = list(inputs[0])
    if rule.kind == "krum":
        floating = [k for k in names if inputs[0][k].is_floating_point()]
        points = torch.stack([torch.cat([t[k].detach().reshape(-1).to(torch.float64) for k in floating]) for t in inputs])
        dist = torch.cdist(points, points, compute_mode="donot_use_mm_for_euclid_dist").square()  # exact, any n
        near = n - rule.f - 2  # the nearest others each input is scored by
        scores = dist.sort(dim=1).values[:, 1 : near + 1].sum(dim=1)  # column 0: the distance to itself
        chosen = sorted(scores.argsort(stable=True)[: rule.m].tolist())
        share = 1.0 / len(chosen)  # unweighted: a sample count a hostile client reports cannot dominate
        return {k: sum(inputs[i][k].detach().to(torch.float64) for i in chosen) * share for k in names}
    out = {}
    for k in names:
        stack = torch.stack([t[k].detach().to(torch.float64) for t in inputs]).sort(dim=0).values
        if rule.kind == "median":
            out[k] = stack[(n - 1) // 2] if n % 2 else (stack[n // 2 - 1] + stack[n // 2]) / 2
        else:  # trimmed
            out[k] = stack[rule.f : n - rule.f].mean(dim=0)
    return out


class WeightedMean:
    """Weighted mean of named tensors, by the run's rule (module docstring); the default rule
    streams: one running sum, whatever the client count.

    Accumulates in float64 so the result does not depend on how many clients are summed
    before rounding; integer tensors (BatchNorm's ``num_batches_tracked``) are averaged too
    and cast back. ``plain``: always the weighted mean (a server-side combination, not of replies).
    """

    def __init__(self, plain: bool = False) -> None:
        self.rule, self.noise = (MEAN, None) if plain else _ACTIVE.get()
        self.sums: dict[str, torch.Tensor] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.total = 0.0
        self.count = 0
        self.inputs: list[Tensors] = []  # a robust rule's buffer

    def add(self, tensors: Tensors, weight: float) -> None:
        if weight < 0:
            raise ValueError(f"aggregation weight must be >= 0 (got {weight})")
        if self.noise is not None:
            weight = 1.0  # DP: unweighted (module docstring)
        known = self.dtypes or (self.inputs[0] if self.inputs else None)
        if known is not None and tensors.keys() != known.keys():
            raise KeyError("clients sent different tensor names to one aggregate")
        if not self.dtypes:
            self.dtypes = {name: value.dtype for name, value in tensors.items()}
        self.count += 1
        self.total += weight
        if self.rule.kind != "mean":
            self.inputs.append({k: v.detach() for k, v in tensors.items()})
        elif not self.sums:
            for name, value in tensors.items():
                self.sums[name] = value.detach().to(torch.float64) * weight
        else:
            for name, value in tensors.items():
                self.sums[name].add_(value.detach().to(torch.float64), alpha=weight)

    def result(self) -> Tensors:
        if self.rule.kind != "mean":
            if not self.inputs:
                raise ValueError("robust aggregate of nothing (no clients)")
            means = _combine(self.rule, self.inputs)
        else:
            if self.total <= 0:
                raise ValueError("weighted mean of nothing (no clients, or all weights zero)")
            sums = self.sums
            if self.noise is not None:
                sums = {k: v + self._noise(v) if self.dtypes[k].is_floating_point else v for k, v in sums.items()}
            means = {k: v / self.total for k, v in sums.items()}
        out = {}
        for name, mean in means.items():
            dtype = self.dtypes[name]
            out[name] = (mean.round() if not dtype.is_floating_point else mean).to(dtype)
        return out

    def _noise(self, like: torch.Tensor) -> torch.Tensor:
        assert self.noise is not None
        draw = torch.randn(like.shape, generator=self.noise.generator, dtype=torch.float64, device="cpu")
        return draw.to(like.device) * self.noise.std


def weighted_mean(items: Iterable[tuple[Tensors, float]]) -> Tensors:
    """``Σ w_k x_k / Σ w_k`` over (tensors, weight) pairs: a server-side combination, never the run's
    rule (that is for replies, :class:`WeightedMean`)."""
    acc = WeightedMean(plain=True)
    for tensors, weight in items:
        acc.add(tensors, weight)
    return acc.result()


def active_rule(plain: bool = False) -> Rule:
    """The rule of the round being aggregated (``plain``: the mean), for per-class statistics."""
    return MEAN if plain else _ACTIVE.get()[0]


def per_class(rule: Rule, inputs: list[tuple[Tensors, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A robust rule applied class by class to per-class statistics (prototypes, class gradients).

    ``inputs``: per client, tensors whose first dimension is the class, and the (C,) mask of the
    classes it holds. For each class the rule runs over its holders' rows, unweighted; a class held
    by fewer clients than the rule needs (``Rule.min_inputs``) is not present (float64 zeros), so a
    hostile holder cannot move a class that too few honest ones vouch for.
    """
    first = inputs[0][0]
    classes = len(inputs[0][1])
    if any(t.keys() != first.keys() or len(held) != classes for t, held in inputs):
        raise KeyError("per-class statistics of different layouts in one mean")
    out = {k: torch.zeros(v.shape, dtype=torch.float64, device=v.device) for k, v in first.items()}
    holds = torch.stack([held.to("cpu", torch.bool) for _, held in inputs])  # one copy, not one per class
    present = torch.zeros(classes, dtype=torch.bool)
    for c in range(classes):
        rows = [{k: t[k][c] for k in first} for (t, _), held in zip(inputs, holds[:, c].tolist()) if held]
        if len(rows) < rule.min_inputs or not rows:
            continue
        for k, v in _combine(rule, rows).items():
            out[k][c] = v
        present[c] = True
    return out, present
