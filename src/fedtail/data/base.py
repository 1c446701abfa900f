"""In-memory tensor datasets.

Images are stored once as uint8 (N, C, H, W) tensors and normalised per batch, so a whole
dataset costs one byte per pixel and a batch is an index lookup (no DataLoader).

A dataset declares its task. Classification: ``y`` holds one int64 label per sample.
Segmentation: ``y`` holds uint8 (N, H, W) masks of class ids, :data:`IGNORE` (255) marking pixels no
loss or metric counts (Cityscapes' void); ``primary`` gives each image the one class the partition
schemes place it by (:func:`fedtail.data.segmentation.primary_classes`); ``background`` names the
class every class a client does not keep becomes (MuPFL's "sets other classes as background"). A
batch's masks come back as int64 through a look-up table (:meth:`Dataset.label_table`): a client's
own labelling, or the dataset's, with ignored pixels at PyTorch's ``ignore_index`` (−100), so
``F.cross_entropy`` skips them unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

Task = Literal["classification", "segmentation"]
IGNORE = 255  # segmentation masks: a pixel no loss or metric counts
IGNORE_INDEX = -100  # the same pixel in a batch's int64 targets (PyTorch's cross-entropy default)


@dataclass(frozen=True)
class Split:
    """One split: inputs ``x`` (uint8 images or float32 features), int64 labels ``y`` (or uint8
    (N, H, W) masks for segmentation, with each image's int64 ``primary`` class) and, for data
    that come split by client (``npz:`` / ``folder:`` files), each row's int64 client id."""

    x: torch.Tensor
    y: torch.Tensor
    clients: torch.Tensor | None = None
    primary: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.clients is not None and self.clients.shape[0] != self.y.shape[0]:
            raise ValueError(f"clients has {self.clients.shape[0]} rows but y has {self.y.shape[0]}")
        if self.y.dim() > 1:
            if self.y.dim() != 3 or self.y.dtype != torch.uint8 or self.x.dim() != 4:
                raise ValueError(f"segmentation masks must be uint8 (N, H, W) beside (N, C, H, W) images, "
                                 f"got {self.y.dtype} {tuple(self.y.shape)} beside {tuple(self.x.shape)}")
            if self.y.shape[1:] != self.x.shape[2:]:
                raise ValueError(f"masks are {tuple(self.y.shape[1:])} but images {tuple(self.x.shape[2:])}")
            if self.primary is None or self.primary.shape != (self.y.shape[0],):
                raise ValueError("segmentation splits need each image's primary class (primary=)")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def to(self, device: torch.device | str) -> "Split":
        """This split with ``x`` and ``y`` on ``device`` (itself when they are there); the client ids
        (partition metadata) stay where they are."""
        device = torch.device(device)
        if self.x.device == device and self.y.device == device:
            return self
        return Split(self.x.to(device), self.y.to(device), self.clients, self.primary)

    @property
    def labels(self) -> np.ndarray:
        """A copy of the labels the partition schemes place samples by (segmentation: each image's
        primary class): a NumPy view would dangle once the tensor moves to shared memory."""
        return (self.y if self.primary is None else self.primary).cpu().numpy().copy()


@dataclass(frozen=True)
class Dataset:
    """A classification or segmentation dataset with its official train and test splits.

    ``mean``/``std`` are per channel and apply to inputs scaled to [0, 1] (uint8 / 255);
    float inputs (synthetic data) are used as they are, then normalised with mean/std.
    Segmentation: ``num_classes`` counts the model's outputs, ``background`` (if any) the last.
    """

    name: str
    train: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] = ()
    task: Task = "classification"
    background: int | None = None  # segmentation: the class of what a client's labelling does not keep
    # Built once: rebuilding them per batch costs more than the normalisation itself.
    _mean_t: torch.Tensor = field(init=False, repr=False, compare=False)
    _std_t: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be positive, got {self.std}")
        segmentation = self.task == "segmentation"
        if segmentation != (self.train.y.dim() > 1) or segmentation != (self.test.y.dim() > 1):
            raise ValueError(f"dataset {self.name!r}: a {self.task} task needs "
                             f"{'uint8 masks' if segmentation else 'one label per sample'} in both splits")
        if self.background is not None and (not segmentation or self.background != self.num_classes - 1):
            raise ValueError(f"dataset {self.name!r}: background must be the last class of a segmentation task")
        if segmentation and not self.num_classes < IGNORE:
            raise ValueError(f"dataset {self.name!r}: segmentation masks hold classes below {IGNORE}")
        device = self.train.x.device
        object.__setattr__(self, "_mean_t", torch.tensor(self.mean, dtype=torch.float32, device=device))
        object.__setattr__(self, "_std_t", torch.tensor(self.std, dtype=torch.float32, device=device))

    @property
    def device(self) -> torch.device:
        """Where the inputs are (and so where batches are made and normalised)."""
        return self.train.x.device

    def to(self, device: torch.device | str) -> "Dataset":
        """This dataset with its splits on ``device`` (itself when they are there): one copy per
        process; uint8 images stay uint8 and are normalised batch by batch on ``device``."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.train.x.device == device and self.test.x.device == device:
            return self
        return dataclasses.replace(self, train=self.train.to(device), test=self.test.to(device))

    @property
    def segmentation(self) -> bool:
        return self.task == "segmentation"

    @property
    def partition_classes(self) -> int:
        """The classes the partition schemes place samples by: all but the background."""
        return self.num_classes - (self.background is not None)

    def label_table(self, keep: torch.Tensor | np.ndarray | None = None) -> torch.Tensor | None:
        """Segmentation: the int64 look-up table (256 entries, on the dataset's device) from mask
        values to training targets: class ids as they are, or only the classes ``keep`` with every
        other class mapped to :attr:`background`; :data:`IGNORE` to :data:`IGNORE_INDEX`.
        None for classification."""
        if not self.segmentation:
            return None
        table = torch.full((256,), IGNORE_INDEX, dtype=torch.int64)
        classes = torch.arange(self.num_classes)
        if keep is None:
            table[: self.num_classes] = classes
        else:
            if self.background is None:
                raise ValueError(f"dataset {self.name!r} has no background class to map the classes a client drops to")
            table[: self.num_classes] = self.background
            kept = torch.as_tensor(np.asarray(keep), dtype=torch.int64)
            table[kept] = kept
        return table.to(self.device)

    def batch(
        self, split: Split, index: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 inputs and labels for the rows ``index`` of ``split``; segmentation
        masks as int64 targets through ``labels`` (a :meth:`label_table`; default: the dataset's)."""
        y = split.y[index]
        if y.dim() > 1:
            y = (self._table if labels is None else labels)[y.long()]
        return self.normalize(split.x[index]), y

    @property
    def _table(self) -> torch.Tensor:
        table = self.__dict__.get("_label_table")
        if table is None or table.device != self.device:
            table = self.label_table()
            object.__setattr__(self, "_label_table", table)
        return table

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 ``(x / 255 if uint8 else x) - mean) / std`` per channel; never modifies ``x``."""
        if x.dtype == torch.uint8:
            x = x.to(torch.float32).mul_(1.0 / 255.0)
        else:
            # copy=True: a float32 input would otherwise be normalised in place (and with it
            # the dataset storage it may be a view of).
            x = x.to(torch.float32, copy=True)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return x.sub_(self._mean_t.view(shape)).div_(self._std_t.view(shape))
