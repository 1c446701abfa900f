"""In-memory tensor datasets.

Images are stored once as uint8 (N, C, H, W) tensors and normalised per batch, so a whole
dataset costs one byte per pixel and a batch is an index lookup (no DataLoader).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Split:
    """One split: inputs ``x`` (uint8 images or float32 features), int64 labels ``y`` and, for
    data that come split by client (``npz:`` / ``folder:`` files), each row's int64 client id."""

    x: torch.Tensor
    y: torch.Tensor
    clients: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.clients is not None and self.clients.shape != self.y.shape:
            raise ValueError(f"clients has {self.clients.shape[0]} rows but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def to(self, device: torch.device | str) -> "Split":
        """This split with ``x`` and ``y`` on ``device`` (itself when they are there); the client ids
        (partition metadata) stay where they are."""
        device = torch.device(device)
        if self.x.device == device and self.y.device == device:
            return self
        return Split(self.x.to(device), self.y.to(device), self.clients)

    @property
    def labels(self) -> np.ndarray:
        """A copy of the labels: a NumPy view would dangle once the tensor moves to shared memory."""
        return self.y.numpy().copy()


@dataclass(frozen=True)
class Dataset:
    """A classification dataset with its official train and test splits.

    ``mean``/``std`` are per channel and apply to inputs scaled to [0, 1] (uint8 / 255);
    float inputs (synthetic data) are used as they are, then normalised with mean/std.
    """

    name: str
    train: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] = ()
    # Built once: rebuilding them per batch costs more than the normalisation itself.
    _mean_t: torch.Tensor = field(init=False, repr=False, compare=False)
    _std_t: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be positive, got {self.std}")
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

    def batch(self, split: Split, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 inputs and labels for the rows ``index`` of ``split``."""
        return self.normalize(split.x[index]), split.y[index]

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
