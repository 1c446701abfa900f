"""Datasets as in-memory tensors: Fashion-MNIST, MNIST, CIFAR-10/100, synthetic and digits.

``load_dataset(name, data_dir=None, download=True, **options)`` is the entry point;
``DATASETS`` maps each name to a one-line description.
"""

from fedtail.data.base import Dataset, Split
from fedtail.data.idx import read_idx, write_idx
# Not re-exporting locate(): it would shadow the submodule fedtail.data.locate.
from fedtail.data.locate import cache_root, search_roots
from fedtail.data.registry import DATASETS, check_name, ensure_dataset, load_dataset

__all__ = [
    "DATASETS",
    "Dataset",
    "Split",
    "cache_root",
    "check_name",
    "ensure_dataset",
    "load_dataset",
    "read_idx",
    "search_roots",
    "write_idx",
]
