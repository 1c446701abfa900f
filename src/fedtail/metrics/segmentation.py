"""Segmentation metrics from pixel confusion matrices (true class × predicted class, int64 counts).

Per class c: IoU = TP / (TP + FP + FN), accuracy = TP / (TP + FN) (pixels of c predicted as c).
mIoU and mAcc average them over the classes that have ground-truth pixels in the evaluated data:
a client's absent classes do not enter its mean (their wrong predictions still count, as false
negatives of the true classes), and Cityscapes' 19-class validation set is averaged over its 19
classes, not the background no pixel of it has. Pixel accuracy is the diagonal over all pixels.
A client's background is a class of its labelling and enters its mean (with β = 1 a client's mIoU is
the mean of its class's IoU and its background's); a class predicted but absent from the ground
truth is left out, where mmsegmentation would count it as an IoU of 0 (its pixels still lower the
IoU of the true classes they belong to). ``per_class_iou`` shows each class alone.

Personalised metrics follow the classification conventions (:mod:`fedtail.metrics.accuracy`):
each client's model on its own data, the unweighted mean over the clients with data as the
headline, ``_weighted`` pooled over clients (every pixel alike); per-class IoU and the
head/middle/tail means are the pooled ones, with the classes ranked by training pixel frequency.
Pooling follows the per-client rule: class c's counts (TP, FP, FN) are summed over the clients
whose ground truth holds c (:func:`pooled_class_scores`). Summing every client's confusion instead
would count, as false positives of c, the pixels of c that a client which does not keep c labels
background (MuPFL's split at β = 1: 18 of fmnist-seg's 20 clients) and a global model rightly calls c; a client
that does not keep c has no c in its mean either, and those pixels still count there as false
negatives of its background. The global model's are of its confusion on the global test split.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def class_scores(confusion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class IoU and accuracy of one confusion matrix (NaN for classes without ground truth)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(confusion)
    truth, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    present = truth > 0
    iou = np.full(len(tp), np.nan)
    acc = np.full(len(tp), np.nan)
    np.divide(tp, truth + predicted - tp, out=iou, where=present)
    np.divide(tp, truth, out=acc, where=present)
    return iou, acc


def pooled_class_scores(confusions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class IoU and accuracy pooled over clients, shaped (clients, classes, classes): class c's
    TP, FP and FN summed over the clients with ground-truth pixels of c (NaN where none has any)."""
    confusions = np.asarray(confusions, dtype=np.float64)
    truth, predicted = confusions.sum(axis=2), confusions.sum(axis=1)  # (clients, classes)
    holds = truth > 0
    tp = (np.einsum("kcc->kc", confusions) * holds).sum(axis=0)
    truth, predicted = (truth * holds).sum(axis=0), (predicted * holds).sum(axis=0)
    present = truth > 0
    iou = np.full(len(tp), np.nan)
    acc = np.full(len(tp), np.nan)
    np.divide(tp, truth + predicted - tp, out=iou, where=present)
    np.divide(tp, truth, out=acc, where=present)
    return iou, acc


def _mean(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def summary(confusion: np.ndarray) -> dict[str, float | None]:
    """mIoU, mAcc and pixel accuracy of one confusion matrix (None when it holds no pixel)."""
    iou, acc = class_scores(confusion)
    pixels = confusion.sum()
    return {"miou": _mean(iou), "macc": _mean(acc), "pixel_acc": float(np.trace(confusion) / pixels) if pixels else None}


def _groups(iou: np.ndarray, groups: tuple[Sequence[int], ...], prefix: str) -> dict[str, float | None]:
    return {f"{prefix}{name}_iou": _mean(iou[list(g)]) for name, g in zip(("head", "middle", "tail"), groups)}


def personalized_segmentation(confusions: np.ndarray, groups: tuple[Sequence[int], ...]) -> dict[str, Any]:
    """The personalised metrics of per-client confusions, shaped (clients, classes, classes)."""
    confusions = np.asarray(confusions)
    has_data = confusions.sum(axis=(1, 2)) > 0
    per_client = [summary(c) for c in confusions]
    pooled_iou, pooled_acc = pooled_class_scores(confusions)
    kept = [p for p, h in zip(per_client, has_data) if h]
    mean = lambda key: _mean(np.array([np.nan if p[key] is None else p[key] for p in kept])) if kept else None  # noqa: E731
    return {
        "personalized_miou": mean("miou"),
        "personalized_miou_weighted": _mean(pooled_iou),
        "personalized_macc": mean("macc"),
        "personalized_macc_weighted": _mean(pooled_acc),
        "per_client_miou": [p["miou"] for p in per_client],
        "per_class_iou": [None if np.isnan(v) else float(v) for v in pooled_iou],
    } | _groups(pooled_iou, groups, "")


def global_segmentation(confusion: np.ndarray, groups: tuple[Sequence[int], ...]) -> dict[str, Any]:
    """The global model's metrics of its confusion on the global test split."""
    iou, _ = class_scores(confusion)
    whole = summary(confusion)
    return {
        "global_miou": whole["miou"],
        "global_macc": whole["macc"],
        "global_per_class_iou": [None if np.isnan(v) else float(v) for v in iou],
    } | _groups(iou, groups, "global_")


# summary.json's entries of a segmentation run (final, best, last10), beside the accuracy ones
SEGMENTATION_KEYS = (
    "personalized_miou",
    "personalized_miou_weighted",
    "personalized_macc",
    "personalized_macc_weighted",
    "head_iou",
    "middle_iou",
    "tail_iou",
    "global_miou",
    "global_macc",
    "global_head_iou",
    "global_middle_iou",
    "global_tail_iou",
)
