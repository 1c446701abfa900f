"""Small convolutional networks of MuPFL, FedReMa and FedAC.

Every body is an ``nn.Sequential`` of separate layers with one ``nn.ReLU`` module per activation,
so layers (e.g. MuPFL's BAVD dropout) can be inserted after an activation by index.
Weights use PyTorch's default initialisation (Kaiming-uniform for conv/linear layers).
"""

from __future__ import annotations

from torch import nn

from fedtail.models.base import SplitModel, check_image_shape, check_num_classes, conv_relu_pool, flat_dim


def cnn_fmnist(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """MuPFL's FashionMNIST CNN: two 5x5 conv layers and a single linear layer (mupfl.txt, Sec. 5.1).

    Body: conv5x5(32, pad 2) -> ReLU -> maxpool2 -> conv5x5(64, pad 2) -> ReLU -> maxpool2 -> flatten
    (64*7*7 = 3136 features on 28x28, 4096 on 32x32). Head: Linear(features, C).
    """
    name = "cnn-fmnist"
    num_classes = check_num_classes(num_classes)
    # Padding 2 keeps the size through each conv, so only the two poolings shrink: 4x4 is the floor.
    c, _, _ = check_image_shape(name, input_shape, min_size=4)
    body = nn.Sequential(*conv_relu_pool(c, 32, 5, padding=2), *conv_relu_pool(32, 64, 5, padding=2), nn.Flatten())
    dim = flat_dim(name, body, input_shape)
    return SplitModel(body, nn.Linear(dim, num_classes), dim, num_classes)


def cnn2fc(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """FedReMa's MNIST/FMNIST CNN: 2 conv + 2 FC layers, the FC layers are the classifier (fedrema.txt).

    Follows FedReMa's released code (PFLlib ``FedAvgCNN``): unpadded 5x5 convs, so the body is
    conv5x5(32) -> ReLU -> maxpool2 -> conv5x5(64) -> ReLU -> maxpool2 -> flatten
    (64*4*4 = 1024 features on 28x28, 1600 on 32x32); head: Linear(features, 512) -> ReLU -> Linear(512, C).
    """
    name = "cnn2fc"
    num_classes = check_num_classes(num_classes)
    # Unpadded: H -> H-4 -> /2 -> -4 -> /2 must stay >= 1, which needs H >= 16 (so no 8x8 digits).
    c, _, _ = check_image_shape(name, input_shape, min_size=16)
    body = nn.Sequential(*conv_relu_pool(c, 32, 5), *conv_relu_pool(32, 64, 5), nn.Flatten())
    dim = flat_dim(name, body, input_shape)
    head = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(inplace=True), nn.Linear(512, num_classes))
    return SplitModel(body, head, dim, num_classes)


def convnet(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """FedAC's convnet: 2 conv + 3 FC layers, the last FC is the decision head (fedac.txt, Sec. 5).

    The classic LeNet-5 layout. Body (FedAC's "embedding"): conv5x5(6) -> ReLU -> maxpool2 ->
    conv5x5(16) -> ReLU -> maxpool2 -> flatten -> Linear(120) -> ReLU -> Linear(84) -> ReLU
    (feature 84). Head: Linear(84, C).
    """
    name = "convnet"
    num_classes = check_num_classes(num_classes)
    # Unpadded like cnn2fc, so 16x16 is the smallest input.
    c, _, _ = check_image_shape(name, input_shape, min_size=16)
    convs = [*conv_relu_pool(c, 6, 5), *conv_relu_pool(6, 16, 5), nn.Flatten()]
    flat = flat_dim(name, nn.Sequential(*convs), input_shape)
    # One flat Sequential (not nested) so activation indices stay simple for layer insertion.
    body = nn.Sequential(
        *convs,
        nn.Linear(flat, 120),
        nn.ReLU(inplace=True),
        nn.Linear(120, 84),
        nn.ReLU(inplace=True),
    )
    return SplitModel(body, nn.Linear(84, num_classes), 84, num_classes)
