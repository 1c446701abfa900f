"""FedReMa's simplified AlexNet for CIFAR-10 (the FedReMa paper, "Model Settings").

Smaller (3x3) kernels, no Dropout and no Local Response Normalisation; the fully connected layers
are the classifier. Weights use PyTorch's default initialisation.
"""

from __future__ import annotations

from torch import nn

from fedtail.models.base import SplitModel, check_image_shape, check_num_classes, conv_relu_pool, flat_dim


def alexnet_small(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """Simplified AlexNet used by FedReMa on CIFAR-10.

    Body: conv3x3(64) -> ReLU -> maxpool2 -> conv3x3(192) -> ReLU -> maxpool2 -> conv3x3(384) -> ReLU
    -> conv3x3(256) -> ReLU -> conv3x3(256) -> ReLU -> maxpool2 -> flatten (all convs padded by 1,
    so 256*4*4 = 4096 features on 32x32, 2304 on 28x28). Head: Linear(features, 1024) -> ReLU ->
    Linear(1024, 512) -> ReLU -> Linear(512, C).
    """
    name = "alexnet-small"
    num_classes = check_num_classes(num_classes)
    # Padded convs keep the size; three poolings by 2 need at least 8x8.
    c, _, _ = check_image_shape(name, input_shape, min_size=8)
    body = nn.Sequential(
        *conv_relu_pool(c, 64, 3, padding=1),
        *conv_relu_pool(64, 192, 3, padding=1),
        nn.Conv2d(192, 384, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = flat_dim(name, body, input_shape)
    head = nn.Sequential(
        nn.Linear(dim, 1024),
        nn.ReLU(inplace=True),
        nn.Linear(1024, 512),
        nn.ReLU(inplace=True),
        nn.Linear(512, num_classes),
    )
    return SplitModel(body, head, dim, num_classes)
