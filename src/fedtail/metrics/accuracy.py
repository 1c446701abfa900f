"""Accuracy metrics of one evaluation, from per-client per-class counts.

Conventions (shared by all four papers): personalised accuracy is each client's model on that
client's own test data; the headline is the unweighted mean over ALL clients (not only the
sampled ones). Head/middle/tail classes are the thirds of the classes ranked by global
training frequency.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def group_accuracy(correct: np.ndarray, total: np.ndarray, classes: Sequence[int]) -> float | None:
    """Pooled accuracy over the samples of ``classes`` (None when there are none)."""
    idx = list(classes)
    n = total[idx].sum()
    return float(correct[idx].sum() / n) if n else None


def personalized_metrics(
    correct: np.ndarray, total: np.ndarray, groups: tuple[Sequence[int], Sequence[int], Sequence[int]]
) -> dict[str, Any]:
    """Metrics of per-client counts: ``correct``/``total`` have shape (clients, classes)."""
    per_client_n = total.sum(axis=1)
    has_data = per_client_n > 0
    acc = _ratio(correct.sum(axis=1), per_client_n)[has_data]
    pooled_c, pooled_t = correct.sum(axis=0), total.sum(axis=0)
    head, middle, tail = groups
    return {
        "personalized_acc": float(acc.mean()),
        "personalized_acc_weighted": float(pooled_c.sum() / pooled_t.sum()),
        "personalized_acc_std": float(acc.std()),
        "personalized_acc_p10": float(np.percentile(acc, 10)),
        "per_client_acc": [float(a) for a in _ratio(correct.sum(axis=1), per_client_n)],
        "per_class_acc": [None if np.isnan(a) else float(a) for a in _ratio(pooled_c, pooled_t)],
        "head_acc": group_accuracy(pooled_c, pooled_t, head),
        "middle_acc": group_accuracy(pooled_c, pooled_t, middle),
        "tail_acc": group_accuracy(pooled_c, pooled_t, tail),
    }


def global_metrics(
    correct: np.ndarray, total: np.ndarray, groups: tuple[Sequence[int], Sequence[int], Sequence[int]]
) -> dict[str, Any]:
    """Metrics of the global model on the balanced global test split (counts per class)."""
    head, middle, tail = groups
    return {
        "global_acc": float(correct.sum() / total.sum()),
        "global_per_class_acc": [None if np.isnan(a) else float(a) for a in _ratio(correct, total)],
        "global_head_acc": group_accuracy(correct, total, head),
        "global_middle_acc": group_accuracy(correct, total, middle),
        "global_tail_acc": group_accuracy(correct, total, tail),
    }


def rounds_to_accuracy(history: Sequence[tuple[int, float]], targets: Sequence[float]) -> dict[str, int | None]:
    """First evaluated round whose accuracy reaches each target (None if never)."""
    out: dict[str, int | None] = {}
    for target in targets:
        out[f"{target:g}"] = next((rnd for rnd, acc in history if acc >= target), None)
    return out
