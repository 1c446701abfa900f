"""In-memory tensor datasets.

Images are stored once as uint8 (N, C, H, W) tensors and normalised per batch, so a whole
dataset costs one byte per pixel and a batch is an index lookup (no DataLoader).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Split:
    """One split: inputs ``x`` (uint8 images or float32 features) and int64 labels ``y``."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def labels(self) -> np.ndarray:
        return self.y.numpy()


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

    def batch(self, split: Split, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 inputs and labels for the rows ``index`` of ``split``."""
        return self.normalize(split.x[index]), split.y[index]

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.train.x.dtype == torch.uint8:
            x = x.mul_(1.0 / 255.0)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32).view(shape)
        return x.sub_(mean).div_(std)
