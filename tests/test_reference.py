"""Head splits: where a model's head starts (``--head``)."""

from __future__ import annotations


import pytest
import torch

from conftest import tiny_raw
from fedtail.config import RunConfig, build_config
from fedtail.errors import ConfigError
from fedtail.models import HEADS, build_model

SHAPE = (1, 28, 28)

# --- models: the split moves, the weights do not ------------------------------------------------


@pytest.mark.parametrize("head", [None, "all-fc", "last"])
def test_every_cnn2fc_split_draws_the_same_weights_and_computes_the_same_function(head):
    torch.manual_seed(0)
    own = build_model("cnn2fc", SHAPE, 10)
    torch.manual_seed(0)
    split = build_model("cnn2fc", SHAPE, 10, head)
    assert [v.shape for v in own.state_dict().values()] == [v.shape for v in split.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(own.state_dict().values(), split.state_dict().values()))
    x = torch.randn(4, *SHAPE)
    assert torch.allclose(own(x), split(x))
    assert set(split.body_keys()) | set(split.head_keys()) == set(split.state_dict())


def test_cnn2fc_heads_hold_both_fc_layers_or_the_last():
    own, last = build_model("cnn2fc", SHAPE, 10), build_model("cnn2fc", SHAPE, 10, "last")
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert (count(own.head), count(own.body), own.feature_dim) == (529_930, 52_096, 1024)  # FedReMa's split
    assert (count(last.head), count(last.body), last.feature_dim) == (5_130, 576_896, 512)  # PFLlib's model.fc
    assert last.head_keys() == ["head.weight", "head.bias"] and last.classifier_keys() == last.head_keys()
    assert "body.7.weight" in last.body_keys()  # FC 512 joined the body, after the flatten
    assert last.features(torch.randn(2, *SHAPE)).min() >= 0  # the body now ends in FC 512's ReLU


def test_convnet_all_fc_head_holds_its_three_linear_layers():
    net = build_model("convnet", SHAPE, 10, "all-fc")
    linears = [m for m in net.head.modules() if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linears] == [120, 84, 10] and net.feature_dim == 16 * 4 * 4
    assert not any(isinstance(m, torch.nn.Linear) for m in net.body.modules())


@pytest.mark.parametrize("name", ["cnn-fmnist", "mlp", "resnet8"])
def test_models_with_a_one_layer_classifier_have_one_split(name):
    shape = (16,) if name == "mlp" else (3, 32, 32) if name == "resnet8" else SHAPE
    keys = [build_model(name, shape, 10, head).head_keys() for head in (None, "last", "all-fc")]
    assert keys[0] == keys[1] == keys[2]
    assert set(HEADS[name].values()) == {1}


def test_unknown_split_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown head split 'fc2'"):
        build_model("cnn2fc", SHAPE, 10, "fc2")


# --- the run config: the split field, reference settings ----------------------------------------


def raw(**overrides):
    """A tiny raw config on a 28x28 model (the data are never loaded here)."""
    data = tiny_raw(model="cnn2fc", dataset="fmnist", **overrides)
    data["dataset_options"] = {}  # tiny_raw merges dicts: the synthetic options would stay
    return data


def test_a_split_equal_to_the_models_own_is_stored_as_null_and_left_out_of_config_json():
    own = RunConfig.model_validate(raw(head="all-fc"))
    assert own.head is None and "head" not in own.model_dump(mode="json")
    assert own.model_dump(mode="json") == RunConfig.model_validate(raw()).model_dump(mode="json")
    moved = RunConfig.model_validate(raw(head="last"))
    assert moved.head == "last" and moved.model_dump(mode="json")["head"] == "last"
    assert RunConfig.model_validate(tiny_raw(head="all-fc")).head is None  # mlp: one split only
    with pytest.raises(ConfigError, match="--head"):
        build_config(raw(head="fc1"))
