"""Per-client local test and validation views.

- "sampled" (default): test size = round(f · n_train) with the client's training label proportions
  (largest-remainder rounding, then >= 1 per trained class when the size allows), drawn without
  replacement from the official test split's samples of each class. Clients draw independently, so
  two clients may share test samples; the stage tasks of one client never do (a class that recurs in
  a later stage is tested on samples its earlier stages did not draw).
- "holdout": f of the client's own samples, stratified per class, keeping >= 1 training sample per
  class when possible; indices then point into the training split.
- validation: a stratified per-client carve of the remaining training indices, same rule as holdout.
"""

from __future__ import annotations

import numpy as np


def round_half_up(x: float) -> int:
    """Conventional rounding (Python's round() is banker's rounding, surprising for sizes)."""
    return int(np.floor(x + 0.5))


def allocate(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Split `total` items over classes in proportion to `weights` (largest remainder, ties by class id),
    never exceeding `caps`; the excess of a capped class is redistributed over the others."""
    weights = np.asarray(weights, dtype=float)
    caps = np.asarray(caps, dtype=np.int64)
    eligible = weights > 0
    total = int(min(total, caps[eligible].sum()))
    alloc = np.zeros(len(weights), dtype=np.int64)
    while (remaining := total - int(alloc.sum())) > 0:
        active = np.flatnonzero(eligible & (alloc < caps))
        quota = remaining * weights[active] / weights[active].sum()
        add = np.floor(quota).astype(np.int64)
        rest = remaining - int(add.sum())
        # Stable sort on the negated fractions: largest remainder first, ties broken by class id.
        add[np.argsort(-(quota - add), kind="stable")[:rest]] += 1
        alloc[active] = np.minimum(alloc[active] + add, caps[active])
    return alloc


def sampled_counts(train_counts: np.ndarray, test_available: np.ndarray, fraction: float) -> np.ndarray:
    """Per-class test counts for the "sampled" rule."""
    size = round_half_up(fraction * train_counts.sum())
    alloc = allocate(size, train_counts, test_available)
    # Give every trained class at least one test sample, taken from the most over-allocated class.
    quota = alloc.sum() * train_counts / max(train_counts.sum(), 1)
    for c in np.argsort(-train_counts, kind="stable"):
        if train_counts[c] > 0 and alloc[c] == 0 and test_available[c] > 0:
            donors = np.flatnonzero(alloc >= 2)
            if len(donors) == 0:
                break
            d = donors[np.argmax(alloc[donors] - quota[donors])]
            alloc[d] -= 1
            alloc[c] += 1
    return alloc


def sample_test(train_idx: np.ndarray, train_labels: np.ndarray, test_by_class: list[np.ndarray],
                fraction: float, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
    """Indices into the test split following the training label proportions of `train_idx`.

    ``exclude``: sorted test indices not to draw (a client's earlier stage tasks' test samples, so
    a class that recurs in a later stage is tested on other samples there).
    """
    num_classes = len(test_by_class)
    if exclude is not None and len(exclude):
        test_by_class = [np.setdiff1d(t, exclude, assume_unique=True) for t in test_by_class]
    counts = np.bincount(train_labels[train_idx], minlength=num_classes)
    avail = np.array([len(t) for t in test_by_class], dtype=np.int64)
    alloc = sampled_counts(counts, avail, fraction)
    parts = [rng.choice(test_by_class[c], size=int(alloc[c]), replace=False) for c in np.flatnonzero(alloc)]
    return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.empty(0, dtype=np.int64)


def carve(idx: np.ndarray, labels: np.ndarray, fraction: float,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split of `idx` into (rest, carved) with |carved| ≈ fraction·|idx|, keeping >= 1 of
    each class in `rest` when possible."""
    empty = np.empty(0, dtype=np.int64)
    if fraction <= 0 or len(idx) == 0:
        return idx.astype(np.int64), empty
    classes, counts = np.unique(labels[idx], return_counts=True)
    alloc = allocate(round_half_up(fraction * len(idx)), counts, counts - 1)
    rest, out = [], []
    for c, k in zip(classes, alloc):
        members = rng.permutation(idx[labels[idx] == c])
        out.append(members[:k])
        rest.append(members[k:])
    return np.sort(np.concatenate(rest)).astype(np.int64), np.sort(np.concatenate(out)).astype(np.int64)
