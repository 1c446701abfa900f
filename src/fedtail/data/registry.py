"""Dataset names and the single entry point :func:`load_dataset`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedtail.data.base import Dataset
from fedtail.data.cifar import load_cifar10, load_cifar100
from fedtail.data.locate import SOURCES, locate
from fedtail.data.mnist import load_fmnist, load_mnist
from fedtail.data.segmentation import load_cityscapes, load_fmnist_seg
from fedtail.data.synthetic import load_digits, load_synthetic
from fedtail.data.tinyimagenet import load_tinyimagenet
from fedtail.errors import ConfigError

DATASETS: dict[str, str] = {
    "fmnist": "Fashion-MNIST: 60k/10k 28x28 grey clothing images, 10 classes",
    "mnist": "MNIST: 60k/10k 28x28 grey handwritten digits, 10 classes",
    "cifar10": "CIFAR-10: 50k/10k 32x32 colour images, 10 classes",
    "cifar100": "CIFAR-100: 50k/10k 32x32 colour images, 100 fine classes",
    "tinyimagenet": "Tiny-ImageNet-200: 100k/10k 64x64 colour images, 200 classes (the labelled validation set as test)",
    "synthetic": "Gaussian mixture in R^dim, generated in memory (options: num_classes, dim, "
    "train_per_class, test_per_class, separation, seed)",
    "digits": "scikit-learn's bundled 8x8 digits (1797 images, 10 classes), stratified 80/20 split, offline",
    "fmnist-seg": "segmentation: canvases of 1-3 Fashion-MNIST items, each pixel its item's class or background "
    "(11 classes), generated from fmnist and cached (options: size, train, test, items, scale, seed)",
    "cityscapes": "segmentation: Cityscapes fine annotations (2975 train / 500 val as test), 19 train ids + "
    "background, resized and cached (options: height, width, cache); the official leftImg8bit/ and gtFine/ folders in --data-dir",
}
# Segmentation datasets: built from another dataset's files (fmnist-seg from fmnist) or read from
# their own folder (Cityscapes, which needs an account to download), with options.
_DERIVED: dict[str, tuple[str, Callable[..., Dataset]]] = {"fmnist-seg": ("fmnist", load_fmnist_seg)}
_FOLDERS: dict[str, Callable[..., Dataset]] = {"cityscapes": load_cityscapes}

_FILE_LOADERS: dict[str, Callable[[Path], Dataset]] = {
    "fmnist": load_fmnist,
    "mnist": load_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "tinyimagenet": load_tinyimagenet,
}
_GENERATED: dict[str, Callable[..., Dataset]] = {"synthetic": load_synthetic, "digits": load_digits}


def check_name(name: str) -> str:
    """``name`` normalised (case, dashes); ConfigError naming the allowed names otherwise."""
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    key = {"fashionmnist": "fmnist", "tinyimagenet200": "tinyimagenet", "fmnistseg": "fmnist-seg"}.get(key, key)
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
    return key


def ensure_dataset(name: str, data_dir: str | Path | None = None, download: bool = True) -> Path | None:
    """Path of the dataset's files (downloading if allowed); None for generated datasets."""
    key = check_name(name)
    if key in _GENERATED:
        return None
    if key in _FOLDERS:
        from fedtail.data.segmentation import find_cityscapes

        return find_cityscapes(data_dir)
    return locate(_DERIVED[key][0] if key in _DERIVED else key, data_dir, download_missing=download)


def load_dataset(name: str, data_dir: str | Path | None = None, download: bool = True, **options: Any) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`).

    File-backed datasets are searched in ``data_dir``, ``$FEDTAIL_DATA_DIR``, the system dataset
    folders and the user cache, then downloaded into the cache if ``download``; ``options`` go to
    generated datasets (synthetic, digits). Raises ConfigError (bad name/options) or DataError.
    """
    key = check_name(name)
    if key in _GENERATED or key in _DERIVED or key in _FOLDERS:
        try:
            if key in _GENERATED:
                return _GENERATED[key](**options)
            if key in _FOLDERS:
                return _FOLDERS[key](data_dir, **options)
            source, loader = _DERIVED[key]
            return loader(locate(source, data_dir, download_missing=download), **options)
        except TypeError as exc:  # unknown keyword
            raise ConfigError(f"bad options for dataset {key!r}: {exc}") from exc
    if options:
        raise ConfigError(f"dataset {key!r} takes no options, got {', '.join(sorted(options))}")
    path = locate(key, data_dir, download_missing=download)
    return _FILE_LOADERS[key](path)


assert set(_FILE_LOADERS) == set(SOURCES)
assert set(_FILE_LOADERS) | set(_GENERATED) | set(_DERIVED) | set(_FOLDERS) == set(DATASETS)
