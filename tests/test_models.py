"""Tests for fedtail.models: shapes, the body/head key split, the classifier, determinism, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedtail.errors import ConfigError
from fedtail.models import MODELS, SplitModel, build_model

NUM_CLASSES = 7  # not 10, so a hard-coded class count would show up
IMAGE_SHAPES = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]
NO_8X8 = {"cnn2fc", "convnet", "convnet-wide", "mobilenetv3-small-seg"}  # 5x5 convs / 3 stride-2 stages need 16x16

CASES = [
    (name, shape)
    for name in MODELS
    if name != "mlp"
    for shape in IMAGE_SHAPES
    if not (shape[1] == 8 and name in NO_8X8)
] + [("mlp", (32,)), ("mlp", (1, 28, 28)), ("mlp", (1, 8, 8))]


def _ids(case: tuple[str, tuple[int, ...]]) -> str:
    return f"{case[0]}-{'x'.join(map(str, case[1]))}"


@pytest.fixture(params=CASES, ids=[_ids(c) for c in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, tuple[int, ...], SplitModel]:
    name, shape = request.param
    torch.manual_seed(0)
    return name, shape, build_model(name, shape, NUM_CLASSES)


def test_output_and_feature_shapes(case: tuple[str, tuple[int, ...], SplitModel]) -> None:
    _, shape, model = case
    x = torch.randn(3, *shape)
    feats = model.features(x)
    if model.dense:  # segmentation: per-pixel logits at the input size from a feature map
        assert model(x).shape == (3, NUM_CLASSES, *shape[1:])
        assert feats.dim() == 4 and feats.shape[:2] == (3, model.feature_dim)
    else:
        assert model(x).shape == (3, NUM_CLASSES)
        assert feats.shape == (3, model.feature_dim)
    assert model.num_classes == NUM_CLASSES
    # forward must be exactly head(body(x)); eval mode so BatchNorm uses the same statistics twice.
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.head(model.features(x)))


def test_keys_partition_state_dict(case: tuple[str, tuple[int, ...], SplitModel]) -> None:
    _, _, model = case
    body, head = model.body_keys(), model.head_keys()
    assert body and head
    assert all(k.startswith("body.") for k in body)
    assert all(k.startswith("head.") for k in head)
    assert set(body).isdisjoint(head)
    assert set(body) | set(head) == set(model.state_dict())
    assert len(body) + len(head) == len(model.state_dict())


def test_classifier_is_last_linear(case: tuple[str, tuple[int, ...], SplitModel]) -> None:
    _, _, model = case
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert model.classifier is linears[-1]
    assert model.classifier.out_features == NUM_CLASSES
    assert model.classifier.in_features in {model.feature_dim, 512}  # 512: inner FC of a deep head
    keys = model.classifier_keys()
    assert len(keys) == 2 and set(keys) <= set(model.head_keys())
    sd = model.state_dict()
    assert {sd[k].data_ptr() for k in keys} == {model.classifier.weight.data_ptr(), model.classifier.bias.data_ptr()}


def test_same_seed_same_weights(case: tuple[str, tuple[int, ...], SplitModel]) -> None:
    name, shape, model = case
    torch.manual_seed(0)
    again = build_model(name, shape, NUM_CLASSES)
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert k1 == k2
        assert torch.equal(v1, v2), k1


def test_backward_reaches_every_parameter(case: tuple[str, tuple[int, ...], SplitModel]) -> None:
    _, shape, model = case
    x = torch.randn(2, *shape)
    y = torch.randint(0, NUM_CLASSES, (2, *shape[1:]) if model.dense else (2,))
    nn.functional.cross_entropy(model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_build_does_not_touch_batchnorm_stats() -> None:
    # The construction-time dry run must not count as a training batch.
    model = build_model("resnet8", (3, 32, 32), 10)
    assert model.training
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert int(m.num_batches_tracked) == 0
            assert torch.equal(m.running_mean, torch.zeros_like(m.running_mean))


def test_feature_dims() -> None:
    assert build_model("resnet8", (3, 32, 32), 10).feature_dim == 256
    assert build_model("resnet18", (3, 32, 32), 10).feature_dim == 512
    assert build_model("cnn-fmnist", (1, 28, 28), 10).feature_dim == 64 * 7 * 7
    assert build_model("cnn2fc", (1, 28, 28), 10).feature_dim == 64 * 4 * 4
    assert build_model("convnet", (3, 32, 32), 10).feature_dim == 84
    assert build_model("convnet-wide", (3, 32, 32), 10).feature_dim == 768
    assert build_model("alexnet-small", (3, 32, 32), 10).feature_dim == 256 * 4 * 4
    assert build_model("mlp", (32,), 10).feature_dim == 64


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "shape", "classes", "count"),
    [
        ("convnet", (3, 32, 32), 10, 62_006),
        ("convnet", (1, 28, 28), 10, 44_426),
        # FedAC's model size: "over 4,700,000" dimensions (the FedAC paper, Sec. 4.3), on CIFAR
        ("convnet-wide", (3, 32, 32), 10, 4_790_538),
        ("convnet-wide", (3, 32, 32), 100, 4_859_748),
        ("convnet-wide", (1, 28, 28), 10, 3_460_234),
    ],
)
def test_parameter_counts(name: str, shape: tuple[int, ...], classes: int, count: int) -> None:
    assert num_parameters(build_model(name, shape, classes)) == count


def test_convnet_wide_is_convnet_with_other_widths() -> None:
    narrow, wide = build_model("convnet", (3, 32, 32), 10), build_model("convnet-wide", (3, 32, 32), 10)
    assert [type(m) for m in narrow.body] == [type(m) for m in wide.body]
    assert narrow.state_dict().keys() == wide.state_dict().keys()
    assert [k for k in wide.body_keys()][-2:] == ["body.9.weight", "body.9.bias"]  # the FCs are in the body
    assert wide.head_keys() == wide.classifier_keys() == ["head.weight", "head.bias"]


def test_smallest_supported_unpadded_input() -> None:
    for name in NO_8X8:
        out = build_model(name, (1, 16, 16), 3)(torch.randn(2, 1, 16, 16)).shape
        assert out == ((2, 3, 16, 16) if name == "mobilenetv3-small-seg" else (2, 3))
        with pytest.raises(ConfigError, match="at least 16"):
            build_model(name, (1, 15, 15), 3)


def test_unknown_name_lists_allowed() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("vgg16", (3, 32, 32), 10)
    for name in MODELS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("cnn2fc", (1, 8, 8)),
        ("convnet", (1, 8, 8)),
        ("convnet-wide", (1, 8, 8)),
        ("alexnet-small", (3, 4, 4)),
        ("cnn-fmnist", (32,)),
        ("resnet8", (32,)),
        ("resnet18", (3, 32)),
        ("mlp", (0,)),
        ("mlp", ()),
        ("cnn-fmnist", (1, 28, -28)),
    ],
)
def test_impossible_shape(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=name):
        build_model(name, shape, 10)


@pytest.mark.parametrize("num_classes", [0, -1, True])
def test_bad_num_classes(num_classes: int) -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", (32,), num_classes)


def test_descriptions_are_one_line() -> None:
    names = {"cnn-fmnist", "cnn2fc", "convnet", "convnet-wide", "alexnet-small", "resnet8", "resnet18", "mlp",
             "mobilenetv3-small-seg", "seg-tiny"}
    assert set(MODELS) == names
    for text in MODELS.values():
        assert text and "\n" not in text


def test_cnn_fmnist_body_has_separate_relus() -> None:
    # MuPFL's BAVD layer is inserted after body activations, so they must be separate modules.
    body = build_model("cnn-fmnist", (1, 28, 28), 10).body
    assert isinstance(body, nn.Sequential)
    assert sum(isinstance(m, nn.ReLU) for m in body) == 2


def test_channels_last_model_computes_the_same_function():
    torch.manual_seed(0)
    plain = build_model("cnn-fmnist", (1, 28, 28), 10)
    fast = build_model("cnn-fmnist", (1, 28, 28), 10)
    fast.load_state_dict(plain.state_dict())
    fast.to_channels_last()
    x = torch.randn(4, 1, 28, 28)
    assert fast.body[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(plain(x), fast(x), atol=1e-5)
    assert torch.allclose(plain.features(x), fast.features(x), atol=1e-5)
    assert fast.state_dict().keys() == plain.state_dict().keys()
