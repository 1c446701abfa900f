"""Small convolutional networks of MuPFL, FedReMa and FedAC.

Every body is an ``nn.Sequential`` of separate layers with one ``nn.ReLU`` module per activation,
so layers (e.g. MuPFL's BAVD dropout) can be inserted after an activation by index.
Weights use PyTorch's default initialisation (Kaiming-uniform for conv/linear layers).
"""

from __future__ import annotations

from torch import nn

from fedtail.models.base import SplitModel, check_image_shape, check_num_classes, conv_relu_pool, flat_dim


def cnn_fmnist(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """MuPFL's FashionMNIST CNN: two 5x5 conv layers and a single linear layer (the MuPFL paper, Sec. 5.1).

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
    """FedReMa's MNIST/FMNIST CNN: 2 conv + 2 FC layers, the FC layers are the classifier (the FedReMa paper).

    Follows FedReMa's released code (PFLlib ``FedAvgCNN``): unpadded 5x5 convs, so the body is
    conv5x5(32) -> ReLU -> maxpool2 -> conv5x5(64) -> ReLU -> maxpool2 -> flatten
    (64*4*4 = 1024 features on 28x28, 1600 on 32x32); head: Linear(features, 512) -> ReLU -> Linear(512, C).
    ``--head last`` (PFLlib's split at ``model.fc``, registry ``HEADS``) moves FC 512 and its ReLU
    into the body: 512 features, a 5,130-parameter head.
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
    """FedAC's convnet: 2 conv + 3 FC layers, the last FC is the decision head (the FedAC paper, Sec. 5).

    The classic LeNet-5 layout. Body (FedAC's "embedding"): conv5x5(6) -> ReLU -> maxpool2 ->
    conv5x5(16) -> ReLU -> maxpool2 -> flatten -> Linear(120) -> ReLU -> Linear(84) -> ReLU
    (feature 84). Head: Linear(84, C). 62,006 parameters on 3x32x32 with 10 classes, 44,426 on
    1x28x28.
    """
    return _lenet("convnet", input_shape, num_classes, (6, 16, 120, 84))


def convnet_wide(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """``convnet`` with the widths of a model of FedAC's size (the FedAC paper, Sec. 4.3: "over 4,700,000" dimensions).

    The paper states only the layer counts (2 conv + 3 FC) and the model's size. Same layout as
    :func:`convnet`, widths 64, 128, 1152, 768 (multiples of 64, FC widths in about LeNet's
    120:84 ratio): body conv5x5(64) -> ReLU -> maxpool2 -> conv5x5(128) -> ReLU -> maxpool2 ->
    flatten -> Linear(1152) -> ReLU -> Linear(768) -> ReLU (feature 768); head Linear(768, C).
    Parameters: 4,790,538 on 3x32x32 with 10 classes (CIFAR-10), 4,859,748 with 100
    (CIFAR-100), 3,460,234 on 1x28x28 with 10 (Fashion-MNIST: the flat conv output is 128x4x4
    there instead of 128x5x5).
    """
    return _lenet("convnet-wide", input_shape, num_classes, (64, 128, 1152, 768))


def _lenet(name: str, input_shape: tuple[int, ...], num_classes: int, widths: tuple[int, int, int, int]) -> SplitModel:
    """2 unpadded conv5x5 + pools, 2 hidden FC layers in the body, the last FC as the head."""
    conv1, conv2, fc1, fc2 = widths
    num_classes = check_num_classes(num_classes)
    # Unpadded like cnn2fc, so 16x16 is the smallest input.
    c, _, _ = check_image_shape(name, input_shape, min_size=16)
    convs = [*conv_relu_pool(c, conv1, 5), *conv_relu_pool(conv1, conv2, 5), nn.Flatten()]
    flat = flat_dim(name, nn.Sequential(*convs), input_shape)
    # One flat Sequential (not nested) so activation indices stay simple for layer insertion.
    body = nn.Sequential(
        *convs,
        nn.Linear(flat, fc1),
        nn.ReLU(inplace=True),
        nn.Linear(fc1, fc2),
        nn.ReLU(inplace=True),
    )
    return SplitModel(body, nn.Linear(fc2, num_classes), fc2, num_classes)
