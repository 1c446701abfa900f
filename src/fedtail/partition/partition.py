"""The result of a partition: per-client index arrays plus JSON-able summaries."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np


def _counts(labels: np.ndarray | None, idx: np.ndarray, num_classes: int) -> np.ndarray:
    if labels is None:
        raise ValueError("label arrays are not attached; build the partition with make_partition")
    return np.bincount(labels[idx], minlength=num_classes).astype(np.int64)


class _CountsMixin:
    """Per-class counts of the train/test/val index views (needs the label references)."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray
    train_split_labels: np.ndarray | None
    test_split_labels: np.ndarray | None

    def train_counts(self, num_classes: int) -> np.ndarray:
        return _counts(self.train_split_labels, self.train, num_classes)

    def test_counts(self, num_classes: int) -> np.ndarray:
        return _counts(self.test_split_labels, self.test, num_classes)

    def val_counts(self, num_classes: int) -> np.ndarray:
        return _counts(self.train_split_labels, self.val, num_classes)


@dataclass
class StageData(_CountsMixin):
    """One stage task of a client (GLDP): its classes and train/test/val index views."""

    classes: np.ndarray
    train: np.ndarray
    test: np.ndarray
    val: np.ndarray
    # References to the split label arrays (shared, not copied) so counts need no extra argument.
    train_split_labels: np.ndarray | None = field(default=None, repr=False, compare=False)
    test_split_labels: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass
class ClientData(_CountsMixin):
    """A client's int64 indices: train and val into the train split, test into the test_source split.

    ``classes`` (``--partition semantic``): the classes of the client's own segmentation labelling;
    every other class of its images is the dataset's background. None: the dataset's labelling.
    """

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray
    stages: list[StageData] = field(default_factory=list)
    classes: np.ndarray | None = None
    train_split_labels: np.ndarray | None = field(default=None, repr=False, compare=False)
    test_split_labels: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass
class ServerData:
    """Samples held by the server (FEDIC): int64 indices into the train split, disjoint from every
    client's. ``labelled`` has the same number of samples of every class; ``unlabelled`` is a
    uniform draw whose labels an algorithm must not use."""

    labelled: np.ndarray
    unlabelled: np.ndarray
    train_split_labels: np.ndarray | None = field(default=None, repr=False, compare=False)

    def summary(self, num_classes: int) -> dict[str, Any]:
        return {
            "labelled_counts": _counts(self.train_split_labels, self.labelled, num_classes).tolist(),
            "unlabelled_counts": _counts(self.train_split_labels, self.unlabelled, num_classes).tolist(),
        }


@dataclass
class Partition:
    """All clients' data views plus the long-tailed pool they were cut from."""

    num_classes: int
    kept: np.ndarray
    global_train_counts: np.ndarray
    clients: list[ClientData]
    test_source: Literal["test", "train"] = "test"
    scheme: str = ""
    server: ServerData | None = None  # None: the server holds no data (the usual case)
    # segmentation: the kept training images' pixels per class (the partition's classes, without the
    # background); head/middle/tail classes are then cut by pixel frequency
    pixel_counts: np.ndarray | None = None

    def train_count_matrix(self) -> np.ndarray:
        """clients × classes matrix of training counts."""
        c = self.num_classes
        if not self.clients:
            return np.zeros((0, c), dtype=np.int64)
        return np.stack([cl.train_counts(c) for cl in self.clients])

    def summary(self) -> dict[str, Any]:
        """JSON-serialisable per-client class counts."""
        c = self.num_classes
        clients = []
        for cl in self.clients:
            entry: dict[str, Any] = {
                "train_counts": cl.train_counts(c).tolist(),
                "test_counts": cl.test_counts(c).tolist(),
                "val_counts": cl.val_counts(c).tolist(),
            }
            if cl.classes is not None:
                entry["classes"] = [int(x) for x in cl.classes]
            if cl.stages:
                entry["stages"] = [{
                    "classes": [int(x) for x in st.classes],
                    "train_counts": st.train_counts(c).tolist(),
                    "test_counts": st.test_counts(c).tolist(),
                    "val_counts": st.val_counts(c).tolist(),
                } for st in cl.stages]
            clients.append(entry)
        out = {
            "scheme": self.scheme,
            "num_classes": int(c),
            "test_source": self.test_source,
            "num_kept": int(len(self.kept)),
            "global_train_counts": [int(x) for x in self.global_train_counts],
            "clients": clients,
        }
        if self.server is not None:  # only then, so partition.json without server data is unchanged
            out["server"] = self.server.summary(c)
        if self.pixel_counts is not None:
            out["global_train_pixel_counts"] = [int(x) for x in self.pixel_counts]
        return out

    def to_json(self, path: str | Path) -> None:
        """Write `summary()` to `path` as indented JSON."""
        Path(path).write_text(json.dumps(self.summary(), indent=2) + "\n")

    def class_frequency_groups(self) -> tuple[list[int], list[int], list[int]]:
        """Head/middle/tail classes: sorted by global training count (desc, ties by id; pixels for
        segmentation), cut in thirds."""
        counts = self.global_train_counts if self.pixel_counts is None else self.pixel_counts
        order = sorted(range(self.num_classes), key=lambda c: (-int(counts[c]), c))
        head, middle, tail = np.array_split(np.array(order, dtype=np.int64), 3)
        return [int(x) for x in head], [int(x) for x in middle], [int(x) for x in tail]
