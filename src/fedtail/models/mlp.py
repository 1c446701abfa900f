"""A two-hidden-layer perceptron for vector inputs and fast tests on synthetic data."""

from __future__ import annotations

from torch import nn

from fedtail.models.base import SplitModel, check_num_classes, check_shape, num_inputs


def mlp(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """MLP (not from a paper; fedtail's fast-test model).

    Body: flatten -> Linear(d, 128) -> ReLU -> Linear(128, 64) -> ReLU (feature 64), where d is
    the number of input scalars (images are flattened). Head: Linear(64, C). PyTorch default init.
    """
    num_classes = check_num_classes(num_classes)
    shape = check_shape("mlp", input_shape)
    body = nn.Sequential(
        nn.Flatten(),  # a no-op on (B, d) vectors, flattens (B, C, H, W) images
        nn.Linear(num_inputs(shape), 128),
        nn.ReLU(inplace=True),
        nn.Linear(128, 64),
        nn.ReLU(inplace=True),
    )
    return SplitModel(body, nn.Linear(64, num_classes), 64, num_classes)
