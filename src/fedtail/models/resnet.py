"""CIFAR-style ResNets (3x3 stem, no initial max-pool) used by CReFF/MuPFL (ResNet-8) and as a larger baseline (ResNet-18).

Body ends with global average pooling and flatten; the head is one linear layer.
Weights use PyTorch's default initialisation (BatchNorm: weight 1, bias 0).
"""

from __future__ import annotations

import torch
from torch import nn

from fedtail.models.base import SplitModel, check_image_shape, check_num_classes, flat_dim


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut (He et al., 2016)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.shortcut: nn.Module
        if stride != 1 or in_planes != planes:
            # Projection shortcut so the sum has matching shape when width or resolution change.
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        # The sum is a fresh tensor no backward needs, so the in-place ReLU on it is safe.
        return self.relu2(out + self.shortcut(x))


def _resnet_body(in_channels: int, blocks: list[int], widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, widths[0], kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(inplace=True),
    ]
    in_planes = widths[0]
    for stage, (count, planes) in enumerate(zip(blocks, widths)):
        # The first stage keeps the resolution; every later stage halves it in its first block.
        stride = 1 if stage == 0 else 2
        stage_blocks: list[nn.Module] = []
        for i in range(count):
            stage_blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
            in_planes = planes
        layers.append(nn.Sequential(*stage_blocks))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers)


def _resnet(name: str, input_shape: tuple[int, ...], num_classes: int, blocks: list[int], widths: list[int]) -> SplitModel:
    num_classes = check_num_classes(num_classes)
    # Strided 3x3 convs with padding 1 never shrink a side below 1 and the pool is adaptive,
    # so any image size works (8x8 digits included).
    c, _, _ = check_image_shape(name, input_shape, min_size=1)
    body = _resnet_body(c, blocks, widths)
    dim = flat_dim(name, body, input_shape)
    return SplitModel(body, nn.Linear(dim, num_classes), dim, num_classes)


def resnet8(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """ResNet-8 of CReFF (scaling 4 of 16/32/64), used by MuPFL on CIFAR (the MuPFL paper, Sec. 5.1).

    Body: conv3x3(64)-BN-ReLU, BasicBlocks [1, 1, 1] with widths 64/128/256 (strides 1/2/2),
    global average pool, flatten (feature 256). Head: Linear(256, C).
    """
    return _resnet("resnet8", input_shape, num_classes, [1, 1, 1], [64, 128, 256])


def resnet18(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """CIFAR-style ResNet-18 (He et al., 2016; no paper in fedtail's set prescribes it).

    Body: conv3x3(64)-BN-ReLU, BasicBlocks [2, 2, 2, 2] with widths 64/128/256/512 (strides 1/2/2/2),
    global average pool, flatten (feature 512). Head: Linear(512, C).
    """
    return _resnet("resnet18", input_shape, num_classes, [2, 2, 2, 2], [64, 128, 256, 512])
