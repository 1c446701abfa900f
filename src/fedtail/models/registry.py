"""Model names, their one-line descriptions and the builder behind each."""

from __future__ import annotations

from collections.abc import Callable

from fedtail.errors import ConfigError
from fedtail.models.alexnet import alexnet_small
from fedtail.models.base import HEAD_SPLITS, SplitModel, resplit
from fedtail.models.cnn import cnn2fc, cnn_fmnist, convnet, convnet_wide
from fedtail.models.mlp import mlp
from fedtail.models.resnet import resnet8, resnet18
from fedtail.models.segmentation import mobilenetv3_small_seg, seg_tiny, width_builder

Builder = Callable[[tuple[int, ...], int], SplitModel]

_BUILDERS: dict[str, Builder] = {
    "cnn-fmnist": cnn_fmnist,
    "cnn2fc": cnn2fc,
    "convnet": convnet,
    "convnet-wide": convnet_wide,
    "alexnet-small": alexnet_small,
    "resnet8": resnet8,
    "resnet18": resnet18,
    "mlp": mlp,
    "mobilenetv3-small-seg": mobilenetv3_small_seg,
    "seg-tiny": seg_tiny,
}

MODELS: dict[str, str] = {
    "cnn-fmnist": "MuPFL FMNIST CNN: body 2x conv5x5 (32, 64) + pools, head 1 linear; feature 3136 on 28x28",
    "cnn2fc": "FedReMa MNIST/FMNIST CNN: body 2x conv5x5 (32, 64) + pools, head FC 512 + FC; feature 1024 on 28x28",
    "convnet": "FedAC convnet (LeNet-5): body 2 conv + FC 120 + FC 84, head last FC; feature 84",
    "convnet-wide": "convnet at FedAC's model size (4.79M on CIFAR-10): conv 64, 128 + FC 1152 + FC 768, head last FC",
    "alexnet-small": "FedReMa CIFAR AlexNet: body 5x conv3x3, head FC 1024 + FC 512 + FC; feature 4096 on 32x32",
    "resnet8": "CReFF/MuPFL ResNet-8 (64/128/256, BN): body to global avg pool, head linear; feature 256",
    "resnet18": "CIFAR-style ResNet-18 (64..512, BN): body to global avg pool, head linear; feature 512",
    "mlp": "MLP for vectors/fast tests: body Linear 128 + Linear 64 (ReLU), head linear; feature 64",
    "mobilenetv3-small-seg": "segmentation: MobileNet-V3-Small + LR-ASPP (MuPFL's Cityscapes model), head the 1x1 "
    "per-pixel classifier; -xW scales the width (e.g. mobilenetv3-small-seg-x0.5)",
    "seg-tiny": "segmentation, for tests and fmnist-seg: 3 conv3x3-BN-ReLU (32, 64 s2, 64 dil2), head 1x1 per-pixel classifier",
}


def builder(name: str) -> Builder | None:
    """The builder of built-in model ``name`` (None when there is no such built-in)."""
    return _BUILDERS.get(name) or width_builder(name)


def family(name: str) -> str:
    """The registry entry of model ``name`` (a width variant's base name)."""
    return "mobilenetv3-small-seg" if width_builder(name) is not None else name


# Where each model's classifier starts: the number of linear layers its head holds under each
# named split (``HEAD_SPLITS``). The first entry is the model's own split, the one its builder
# makes and every run used before runs could choose (``RunConfig.head`` = None). Models whose
# classifier is one linear layer have a single split under both names; an MLP's hidden layers are
# its feature extractor, so its "all-fc" head is its last layer too.
HEADS: dict[str, dict[str, int]] = {
    "cnn-fmnist": {"last": 1, "all-fc": 1},
    "cnn2fc": {"all-fc": 2, "last": 1},  # FedReMa's classifier is FC 512 + FC; PFLlib's head is the last FC
    "convnet": {"last": 1, "all-fc": 3},
    "convnet-wide": {"last": 1, "all-fc": 3},
    "alexnet-small": {"all-fc": 3, "last": 1},
    "resnet8": {"last": 1, "all-fc": 1},
    "resnet18": {"last": 1, "all-fc": 1},
    "mlp": {"last": 1, "all-fc": 1},
    "mobilenetv3-small-seg": {"last": 1, "all-fc": 1},  # the head is the 1x1 per-pixel classifier
    "seg-tiny": {"last": 1, "all-fc": 1},
}


def own_head(name: str) -> str:
    """The split model ``name``'s builder makes (what ``head = None`` means)."""
    return next(iter(HEADS[family(name)]))


def head_layers(name: str, head: str | None) -> int:
    """Linear layers in model ``name``'s head under split ``head`` (None: the model's own)."""
    splits = HEADS[family(name)]
    if head is None:
        return splits[own_head(name)]
    if head not in splits:
        raise ConfigError(f"unknown head split {head!r}; allowed: {', '.join(HEAD_SPLITS)}")
    return splits[head]


def describe_heads(name: str) -> str:
    """The splits of model ``name`` for ``fedtail list``, e.g. 'all-fc (own) = 2 FC, last = 1 FC'."""
    parts = []
    for i, (split, n) in enumerate(HEADS[family(name)].items()):
        parts.append(f"{split}{' (own)' if i == 0 else ''} = {n} FC")
    return ", ".join(parts)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, head: str | None = None) -> SplitModel:
    """Build model ``name`` for inputs shaped ``input_shape`` (no batch dim) and ``num_classes`` classes.

    ``head`` names the split between body and head (``HEAD_SPLITS``; None: the model's own).
    Any split draws the same weights: only the boundary, and so the key names, move.
    Weights come from torch's global RNG, so seed it first for reproducible models.
    Raises ConfigError for an unknown name or an input shape the model cannot handle.
    """
    builder = _BUILDERS.get(name) or width_builder(name)
    if builder is None:
        raise ConfigError(f"unknown model {name!r}; allowed: {', '.join(sorted(_BUILDERS))}")
    layers = head_layers(name, head)
    model = builder(input_shape, num_classes)
    return model if layers == head_layers(name, None) else resplit(model, layers)
