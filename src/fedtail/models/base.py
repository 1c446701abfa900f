"""The body/head split every fedtail model follows, plus shape helpers shared by the builders.

Algorithms share, freeze or personalise parts of a model by state_dict key prefix: everything
before the flat feature vector lives under ``body.``, the classifier under ``head.``.
"""

from __future__ import annotations

import math
import operator
from typing import Literal

import torch
from torch import nn

from fedtail.errors import ConfigError


class SplitModel(nn.Module):
    """A classifier split into a feature extractor ``body`` and a classifier ``head``.

    ``body(x)`` is a flat ``(B, feature_dim)`` tensor and ``head`` maps it to ``(B, num_classes)``
    logits. The last ``nn.Linear`` of ``head`` is exposed as :attr:`classifier` (CReFF and FedReMa
    re-train it). Replace layers by editing ``body``/``head`` in place, never by assigning new
    attributes on the model, so the two key prefixes keep covering the whole state_dict.
    """

    def __init__(self, body: nn.Module, head: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.feature_dim = int(feature_dim)
        self.num_classes = int(num_classes)
        # Fail at construction, not inside some algorithm, if the head has no logits layer.
        self._check_classifier()

    channels_last = False  # set by to_channels_last()
    dense = False  # per-pixel logits (models/segmentation.py's DenseSplitModel)

    def _check_classifier(self) -> None:
        last = self.classifier
        if last.out_features != self.num_classes:
            raise ValueError(
                f"the head's last Linear has {last.out_features} outputs, expected {self.num_classes}"
            )

    def to_channels_last(self) -> "SplitModel":
        """Store 4-D weights channels-last and feed images that way.

        Measured on the CPU build (benchmarks/layout.py): 1.1–1.5× faster training steps for the CNNs.
        Float rounding differs from the default layout, so it is a run setting
        (``RunConfig.channels_last``), not a silent switch.
        """
        self.to(memory_format=torch.channels_last)
        self.channels_last = True
        return self

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self._layout(x)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The flat ``(B, feature_dim)`` representation the head classifies."""
        return self.body(self._layout(x))

    @property
    def classifier(self) -> nn.Linear:
        """The last ``nn.Linear`` of the head, the one producing the logits."""
        return self._classifier_entry()[1]

    def _classifier_entry(self) -> tuple[str, nn.Linear]:
        found: tuple[str, nn.Linear] | None = None
        for name, module in self.head.named_modules():
            if isinstance(module, nn.Linear):
                found = (name, module)
        if found is None:
            raise ValueError("the head contains no nn.Linear layer")
        return found

    def body_keys(self) -> list[str]:
        """state_dict keys of the feature extractor (all start with ``body.``)."""
        return [k for k in self.state_dict() if k.startswith("body.")]

    def head_keys(self) -> list[str]:
        """state_dict keys of the classifier head (all start with ``head.``)."""
        return [k for k in self.state_dict() if k.startswith("head.")]

    def classifier_keys(self) -> list[str]:
        """state_dict keys of :attr:`classifier` alone (a subset of :meth:`head_keys`)."""
        name = self._classifier_entry()[0]
        prefix = f"head.{name}." if name else "head."
        return [k for k in self.head_keys() if k.startswith(prefix)]


HeadSplit = Literal["last", "all-fc"]
HEAD_SPLITS: dict[str, str] = {
    "last": "the last linear layer alone (PFLlib's model.fc; FedBABU's, FedPer's, FedRep's, FedPAC's head)",
    "all-fc": "every fully connected layer after the feature extractor (FedReMa's classifier)",
}


def resplit(model: SplitModel, head_layers: int) -> SplitModel:
    """The same layers (and weights) with the head holding the last ``head_layers`` linear layers.

    The body and head are laid end to end and cut again just before the ``head_layers``-th
    ``nn.Linear`` from the end, so the activations between the moved linear layers move with
    them: cnn2fc's body + [FC 512, ReLU, FC] with ``head_layers = 1`` becomes body + [FC 512,
    ReLU] and the head FC. Only the key names change (``head.0.weight`` → ``body.7.weight``);
    the tensors, their order in the state_dict and so the initial weights drawn for a seed are
    those of the original split. A split that is already the model's returns the model as it is.
    """
    head = list(model.head) if isinstance(model.head, nn.Sequential) else [model.head]
    if sum(isinstance(m, nn.Linear) for m in head) == head_layers and isinstance(head[0], nn.Linear):
        return model
    if not isinstance(model.body, nn.Sequential):
        raise ValueError("only a flat nn.Sequential body can be split elsewhere")
    layers = [*model.body, *head]
    linear = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    if not 1 <= head_layers <= len(linear):
        raise ValueError(f"the model has {len(linear)} linear layers, a head of {head_layers} asked for")
    cut = linear[-head_layers]
    new_head = layers[cut] if cut == len(layers) - 1 else nn.Sequential(*layers[cut:])
    first = layers[cut]
    return SplitModel(nn.Sequential(*layers[:cut]), new_head, first.in_features, model.num_classes)


def check_num_classes(num_classes: int) -> int:
    """Validate the number of classes (a positive int)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    return num_classes


def check_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Validate that ``input_shape`` is a non-empty tuple of positive ints (batch dim excluded)."""
    try:
        # operator.index accepts numpy integers (shapes read from arrays) but rejects floats.
        shape = tuple(operator.index(d) for d in input_shape if not isinstance(d, bool))
        if len(shape) != len(tuple(input_shape)):
            raise TypeError
    except TypeError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise ConfigError(
            f"model {name!r}: input_shape must be a non-empty tuple of positive ints "
            f"(without the batch dimension), got {input_shape!r}"
        )
    return shape


def check_image_shape(name: str, input_shape: tuple[int, ...], min_size: int) -> tuple[int, int, int]:
    """Validate a ``(C, H, W)`` image shape whose sides are at least ``min_size`` pixels."""
    shape = check_shape(name, input_shape)
    if len(shape) != 3:
        raise ConfigError(
            f"model {name!r} needs image inputs shaped (channels, height, width), got {shape}; "
            "use 'mlp' for vector inputs"
        )
    c, h, w = shape
    if h < min_size or w < min_size:
        raise ConfigError(
            f"model {name!r} cannot handle {h}x{w} images: its convolutions and poolings shrink "
            f"them to nothing (height and width must be at least {min_size})"
        )
    return c, h, w


def flat_dim(name: str, body: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Size of the body's flat output, found with a dry run on one zero input.

    Runs in eval mode so BatchNorm running statistics are not touched, and on zeros so the
    global RNG (which the caller seeded for reproducible weights) is not consumed.
    """
    was_training = body.training
    body.eval()
    try:
        with torch.no_grad():
            param = next(body.parameters(), None)
            out = body(torch.zeros(1, *input_shape, device="cpu" if param is None else param.device))
    except RuntimeError as exc:  # e.g. a kernel larger than the remaining feature map
        raise ConfigError(f"model {name!r} cannot handle input shape {tuple(input_shape)}: {exc}") from None
    finally:
        body.train(was_training)
    if out.dim() != 2:
        raise ValueError(f"model {name!r}: body must end in a flat vector, got shape {tuple(out.shape)}")
    return int(out.shape[1])


def num_inputs(input_shape: tuple[int, ...]) -> int:
    """Number of scalars in one input (for models that flatten first)."""
    return math.prod(input_shape)


def conv_relu_pool(c_in: int, c_out: int, kernel: int, padding: int = 0) -> list[nn.Module]:
    """Conv -> ReLU -> 2x2 max-pool as a flat list, so bodies stay one flat Sequential."""
    return [nn.Conv2d(c_in, c_out, kernel_size=kernel, padding=padding), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
