"""Datasets that need no files: a Gaussian mixture and scikit-learn's bundled 8x8 digits."""

from __future__ import annotations

import numpy as np
import torch

from fedtail.data.base import Dataset, Split
from fedtail.errors import ConfigError


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ConfigError(f"synthetic option {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def load_synthetic(
    num_classes: int = 10,
    dim: int = 32,
    train_per_class: int = 500,
    test_per_class: int = 100,
    separation: float = 3.0,
    seed: int = 0,
) -> Dataset:
    """Class-conditional Gaussians: class means at distance ``separation`` from the origin, unit noise.

    Deterministic in ``seed``; float32 features of shape (N, dim), rows shuffled.
    """
    k = _positive_int("num_classes", num_classes, 2)
    d = _positive_int("dim", dim)
    n_tr = _positive_int("train_per_class", train_per_class)
    n_te = _positive_int("test_per_class", test_per_class)
    if not np.isfinite(separation) or separation < 0:
        raise ConfigError(f"synthetic option separation must be a finite number >= 0, got {separation!r}")
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, d))
    centers *= float(separation) / np.linalg.norm(centers, axis=1, keepdims=True)

    def draw(per_class: int) -> Split:
        y = np.repeat(np.arange(k, dtype=np.int64), per_class)
        x = centers[y] + rng.standard_normal((y.size, d))
        order = rng.permutation(y.size)
        return Split(torch.from_numpy(x[order].astype(np.float32)), torch.from_numpy(y[order]))

    train, test = draw(n_tr), draw(n_te)
    return Dataset(
        name="synthetic",
        train=train,
        test=test,
        num_classes=k,
        input_shape=(d,),
        mean=(0.0,) * d,
        std=(1.0,) * d,
        class_names=tuple(f"class {i}" for i in range(k)),
    )


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's 1797 8x8 digits as uint8 (N, 1, 8, 8), stratified train/test split."""
    from sklearn.datasets import load_digits as sk_load_digits  # lazy: sklearn import is slow
    from sklearn.model_selection import train_test_split

    if not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(f"digits option test_fraction must be in (0, 1), got {test_fraction!r}")
    bunch = sk_load_digits()
    # Values are 0..16: rescale to the 0..255 range every uint8 image in fedtail uses.
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    idx_tr, idx_te = train_test_split(
        np.arange(labels.size), test_size=test_fraction, stratify=labels, random_state=seed
    )
    idx_tr, idx_te = np.sort(idx_tr), np.sort(idx_te)
    x_tr = images[idx_tr]
    scaled = x_tr.astype(np.float64) / 255.0
    mean, std = float(scaled.mean()), float(scaled.std())
    return Dataset(
        name="digits",
        train=Split(torch.from_numpy(np.ascontiguousarray(x_tr)), torch.from_numpy(labels[idx_tr])),
        test=Split(torch.from_numpy(np.ascontiguousarray(images[idx_te])), torch.from_numpy(labels[idx_te])),
        num_classes=10,
        input_shape=(1, 8, 8),
        mean=(round(mean, 4),),
        std=(round(std, 4),),
        class_names=tuple(str(d) for d in range(10)),
    )
