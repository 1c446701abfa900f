"""MNIST and Fashion-MNIST from the four standard IDX files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedtail.data.base import Dataset, Split
from fedtail.data.idx import read_idx
from fedtail.data.locate import MNIST_STEMS, find_idx_file
from fedtail.errors import DataError

FMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
MNIST_CLASSES = tuple(str(d) for d in range(10))
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


def _read_split(directory: Path, images_stem: str, labels_stem: str, num_classes: int) -> Split:
    paths = []
    for stem in (images_stem, labels_stem):
        p = find_idx_file(directory, stem)
        if p is None:
            raise DataError(f"missing {stem}(.gz) in {directory}")
        paths.append(p)
    images = read_idx(paths[0], ndim=3)
    labels = read_idx(paths[1], ndim=1)
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise DataError(f"{paths[0]} / {paths[1]}: expected uint8 data, got {images.dtype} / {labels.dtype}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{paths[0]} has {images.shape[0]} images but {paths[1]} has {labels.shape[0]} labels")
    if labels.size and int(labels.max()) >= num_classes:
        raise DataError(f"{paths[1]} has label {int(labels.max())}, expected 0..{num_classes - 1}")
    x = torch.from_numpy(images).unsqueeze(1)  # (N, 1, H, W): a view, no copy
    y = torch.from_numpy(labels.astype(np.int64))
    return Split(x, y)


def load_idx_dataset(
    name: str,
    directory: str | Path,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    class_names: tuple[str, ...],
) -> Dataset:
    """A Dataset from the four MNIST-format files in ``directory``."""
    directory = Path(directory)
    k = len(class_names)
    train = _read_split(directory, MNIST_STEMS[0], MNIST_STEMS[1], k)
    test = _read_split(directory, MNIST_STEMS[2], MNIST_STEMS[3], k)
    if train.x.shape[1:] != test.x.shape[1:]:
        raise DataError(f"{directory}: train images are {tuple(train.x.shape[1:])}, test {tuple(test.x.shape[1:])}")
    return Dataset(
        name=name,
        train=train,
        test=test,
        num_classes=k,
        input_shape=tuple(int(s) for s in train.x.shape[1:]),
        mean=mean,
        std=std,
        class_names=class_names,
    )


def load_fmnist(directory: str | Path) -> Dataset:
    return load_idx_dataset("fmnist", directory, FMNIST_MEAN, FMNIST_STD, FMNIST_CLASSES)


def load_mnist(directory: str | Path) -> Dataset:
    return load_idx_dataset("mnist", directory, MNIST_MEAN, MNIST_STD, MNIST_CLASSES)
