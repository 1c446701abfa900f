"""A model written outside fedtail: a function (input_shape, num_classes) -> SplitModel.

    PYTHONPATH=examples fedtail run --model my_model:tiny_cnn --dataset digits --rounds 5 --out runs/cnn

The body maps an input to a feature vector; the head (the classifier) maps it to logits. Methods
that personalise or exchange only part of the model (FedRep, FedPer, FedBABU, MuPFL's PKCF, ...)
use that split.
"""

from __future__ import annotations

from torch import nn

from fedtail.api import SplitModel


def tiny_cnn(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """Images C×H×W: one 3×3 convolution (16 channels), pooled to 4×4, then a 32-wide layer."""
    if len(input_shape) != 3:
        raise ValueError(f"tiny_cnn takes images C×H×W (got input shape {input_shape})")
    body = nn.Sequential(
        nn.Conv2d(input_shape[0], 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 32),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(32, num_classes), 32, num_classes)
