"""Dense (per-pixel) models with the body/head split: the head is the final per-pixel classifier.

:class:`DenseSplitModel` is a :class:`~fedtail.models.base.SplitModel` whose body ends in a feature
*map* ``(B, feature_dim, h, w)`` and whose head is a per-pixel linear layer (:attr:`classifier`, a
1×1 convolution) followed by a parameter-free bilinear upsampling to the input size, so
``model(x)`` is ``(B, num_classes, H, W)`` logits (the classifier, an ``nn.Linear`` applied per pixel, sees the
pixels as ``(B, h, w, feature_dim)`` rows). Algorithms that share, freeze or re-train the head
do so on the per-pixel classifier, as MuPFL's PKCF and FedRep's head do on a classifier.

``mobilenetv3-small-seg``: MobileNet-V3-Small (Howard et al., "Searching for MobileNetV3", ICCV 2019,
Table 2: the bottleneck table, hard-swish, squeeze-and-excite) with the paper's Lite R-ASPP
segmentation head (Sec. 6.4, Fig. 10): the last stage dilated instead of strided (output stride 16),
a 128-channel 1×1 branch gated by a sigmoid of its global average (the "scale" branch), upsampled ×2
and classified together with the stride-8 features. LR-ASPP sums two 1×1 classifiers, one per
branch; here they are one 1×1 convolution over the two branches concatenated, the same function
with one bias, so that the head is a single per-pixel linear layer. ``-xW`` scales every channel
count by W (rounded to a multiple of 8, as the paper's width multiplier), for CPU runs. The
classification variant of the same backbone has 2,542,856 parameters at 1000 classes, the count
published for MobileNet-V3-Small (torchvision's ``mobilenet_v3_small``); a test checks it. Written
here rather than taken from torchvision: each torchvision release pins one torch release exactly
(0.28 requires torch == 2.13.0), so fedtail's metadata could not depend on it and still accept the
CUDA builds of other torch versions that GPU machines bring, and torchvision's LR-ASPP exists for
MobileNet-V3-Large only.

``seg-tiny``: a small CPU model for tests and the fmnist-seg benchmark: three 3×3 conv-BN-ReLU
blocks (32, 64 at stride 2, 64 dilated 2) to a stride-2 map, head as above.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from fedtail.models.base import SplitModel, check_image_shape, check_num_classes


class DenseSplitModel(SplitModel):
    """A segmentation model: body to a feature map, head = per-pixel linear classifier + upsampling."""

    dense = True

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int, size: tuple[int, int]) -> None:
        head = nn.Sequential(PerPixel(nn.Linear(feature_dim, num_classes)), Upsample(size))
        super().__init__(body, head, feature_dim, num_classes)


class PerPixel(nn.Module):
    """An ``nn.Linear`` applied to every pixel's channel vector (a 1×1 convolution whose weight is
    the Linear's): ``model.classifier`` stays an ``nn.Linear``, so every method that re-trains,
    shares or reads the classifier (CReFF, PKCF, FedRep's head) does so on the per-pixel classifier."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.movedim(1, -1)).movedim(-1, 1)


class Upsample(nn.Module):
    """Bilinear resize of logits to the input size (no parameters; commutes with the 1×1 conv)."""

    def __init__(self, size: tuple[int, int]) -> None:
        super().__init__()
        self.size = tuple(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if tuple(x.shape[-2:]) == self.size else F.interpolate(x, self.size, mode="bilinear", align_corners=False)


def _divisible(v: float, divisor: int = 8) -> int:
    """The paper's channel rounding: the nearest multiple of ``divisor``, never below 90 % of ``v``."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


def _cbn(c_in: int, c_out: int, k: int = 1, stride: int = 1, dilation: int = 1, groups: int = 1, act: type | None = None):
    pad = (k - 1) // 2 * dilation
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, stride, pad, dilation, groups, bias=False), nn.BatchNorm2d(c_out)]
    if act is not None:
        layers.append(act(inplace=True))
    return layers


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        squeeze = _divisible(channels // 4)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class Bottleneck(nn.Module):
    """MobileNet-V3's inverted residual: expand 1×1, depthwise k×k, optional SE, project 1×1."""

    def __init__(self, c_in: int, k: int, exp: int, c_out: int, se: bool, act: type, stride: int, dilation: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if exp != c_in:
            layers += _cbn(c_in, exp, act=act)
        layers += _cbn(exp, exp, k, stride, dilation, groups=exp, act=act)
        if se:
            layers.append(SqueezeExcite(exp))
        layers += _cbn(exp, c_out)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


# Table 2 of the paper: kernel, expansion, output channels, SE, activation, stride.
_SMALL = (
    (3, 16, 16, True, nn.ReLU, 2),
    (3, 72, 24, False, nn.ReLU, 2),
    (3, 88, 24, False, nn.ReLU, 1),
    (5, 96, 40, True, nn.Hardswish, 2),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 120, 48, True, nn.Hardswish, 1),
    (5, 144, 48, True, nn.Hardswish, 1),
    (5, 288, 96, True, nn.Hardswish, 2),
    (5, 576, 96, True, nn.Hardswish, 1),
    (5, 576, 96, True, nn.Hardswish, 1),
)
_LOW_LEVEL = 3  # the blocks before the stride-8 features LR-ASPP's low-level branch reads


def mobilenetv3_small_features(c_in: int, width: float = 1.0, dilated: bool = False) -> tuple[nn.Sequential, nn.Sequential, int, int]:
    """MobileNet-V3-Small's feature extractor as (stride-8 part, rest to the last 1×1 conv), with the
    channels of their outputs; ``dilated``: the last stage at stride 1 with dilation 2 (output stride 16)."""
    first = _divisible(16 * width)
    layers: list[nn.Module] = [nn.Sequential(*_cbn(c_in, first, 3, 2, act=nn.Hardswish))]
    c, dilation = first, 1
    for i, (k, exp, out, se, act, stride) in enumerate(_SMALL):
        if dilated and i >= 8 and stride == 2:
            stride, dilation = 1, 2
        layers.append(Bottleneck(c, k, _divisible(exp * width), _divisible(out * width), se, act, stride, dilation))
        c = _divisible(out * width)
        if i == _LOW_LEVEL - 1:
            low, low_c = nn.Sequential(*layers), c
            layers = []
    last = 6 * c
    layers.append(nn.Sequential(*_cbn(c, last, act=nn.Hardswish)))
    return low, nn.Sequential(*layers), low_c, last


class LRASPPBody(nn.Module):
    """MobileNet-V3-Small + LR-ASPP up to the classifier: ``cat(up(relu(bn(conv(high))) · gate), low)``."""

    def __init__(self, c_in: int, width: float, inter: int = 128) -> None:
        super().__init__()
        self.low, self.high, low_c, high_c = mobilenetv3_small_features(c_in, width, dilated=True)
        self.cbr = nn.Sequential(*_cbn(high_c, inter, act=nn.ReLU))
        self.scale = nn.Conv2d(high_c, inter, 1, bias=False)
        self.channels = inter + low_c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.low(x)
        high = self.high(low)
        branch = self.cbr(high) * torch.sigmoid(self.scale(F.adaptive_avg_pool2d(high, 1)))
        branch = F.interpolate(branch, size=low.shape[-2:], mode="bilinear", align_corners=False)
        return torch.cat((branch, low), dim=1)


def mobilenetv3_small_seg(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> DenseSplitModel:
    """MobileNet-V3-Small with LR-ASPP (see the module docstring), logits at the input size."""
    name = "mobilenetv3-small-seg" + ("" if width == 1.0 else f"-x{width:g}")
    c, h, w = check_image_shape(name, input_shape, 16)
    body = LRASPPBody(c, width)
    return DenseSplitModel(body, body.channels, check_num_classes(num_classes), (h, w))


def mobilenetv3_small_classifier(num_classes: int = 1000, width: float = 1.0) -> nn.Module:
    """The classification MobileNet-V3-Small (pool, FC 1024 hard-swish, FC): the published
    architecture whose parameter count checks the backbone."""
    low, high, _, last = mobilenetv3_small_features(3, width)
    return nn.Sequential(low, high, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(last, 1024), nn.Hardswish(),
                         nn.Dropout(0.2), nn.Linear(1024, num_classes))  # fmt: skip


def seg_tiny(input_shape: tuple[int, ...], num_classes: int) -> DenseSplitModel:
    """The small CPU segmentation model (see the module docstring)."""
    c, h, w = check_image_shape("seg-tiny", input_shape, 4)
    body = nn.Sequential(
        *_cbn(c, 32, 3, act=nn.ReLU), *_cbn(32, 64, 3, 2, act=nn.ReLU), *_cbn(64, 64, 3, 1, 2, act=nn.ReLU)
    )
    return DenseSplitModel(body, 64, check_num_classes(num_classes), (h, w))


def width_builder(name: str):
    """The builder of ``mobilenetv3-small-seg-xW`` (W > 0), or None for another name."""
    prefix = "mobilenetv3-small-seg-x"
    if not name.startswith(prefix):
        return None
    try:
        width = float(name[len(prefix) :])
    except ValueError:
        return None
    return partial(mobilenetv3_small_seg, width=width) if 0 < width <= 4 else None
