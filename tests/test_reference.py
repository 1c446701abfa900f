"""Head splits and reference settings: where a model's head starts (``--head``), each algorithm's
reference split, momentum and clipping filled into runs that do not set them, stored configs
read literally, and the split reaching the algorithms (FedBABU's frozen head, FedPer's kept head,
FedProto's prototypes) in runs on a cnn2fc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_raw
from fedtail.algorithms import ALGORITHMS
from fedtail.components import algorithm_options, build_config, resolved_options
from fedtail.config import RunConfig
from fedtail.report.runfiles import config_diff
from fedtail.data.fixtures import write_idx_dataset
from fedtail.errors import ConfigError
from fedtail.models import HEADS, build_model
from helpers import fit, invoke, run, runtime

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


# (algorithm, head stored for cnn2fc, momentum, grad_clip): FedReMa's Table 1 methods and FedRep
REFERENCES = [
    ("local", None, 0.0, None),
    ("fedavg", None, 0.0, None),
    ("fedprox", None, 0.0, None),
    ("moon", "last", 0.0, None),
    ("fedproto", "last", 0.0, None),
    ("fedper", "last", 0.0, None),
    ("perfedavg", None, 0.0, None),
    ("feddistill", None, 0.0, None),
    ("fedbabu", "last", 0.0, None),
    ("fedpac", "last", 0.0, None),
    ("fedrep", "last", 0.5, None),
    ("fedrema", None, 0.9, 10.0),  # both FC layers: cnn2fc's own split, so nothing is stored
]


@pytest.mark.parametrize("algorithm, head, momentum, clip", REFERENCES)
def test_runs_get_their_algorithms_reference_split_and_optimizer(algorithm, head, momentum, clip):
    config = build_config(raw(algorithm=algorithm))
    assert (config.head, config.train.momentum, config.train.grad_clip) == (head, momentum, clip)
    dumped = config.model_dump(mode="json")
    assert dumped.get("head") == head and ("head" in dumped) == (head is not None)
    assert (dumped["train"]["momentum"], dumped["train"]["grad_clip"]) == (momentum, clip)


# Options unlike their defaults that PFLlib's code runs with (serverdistill/serverproto/serverpac:
# plain means over the uploading clients; clientdistill: MSE between logits, one teacher for all)
REFERENCE_OPTIONS = [
    ("feddistill", {"regularizer": "mse", "exclude_self": False, "aggregation": "uniform"}),
    ("fedproto", {"aggregation": "uniform", "prototypes": "training"}),
    ("fedpac", {"aggregation": "uniform"}),
    ("perfedavg", {"beta": None, "steps": "pfllib"}),
]


@pytest.mark.parametrize("algorithm, expected", REFERENCE_OPTIONS)
def test_runs_get_the_options_their_reference_code_uses(algorithm, expected):
    options = build_config(raw(algorithm=algorithm)).options
    assert {k: options[k] for k in expected} == expected
    # without the reference (a stored config read literally) the option defaults stand
    bare = algorithm_options(build_config(raw(algorithm=algorithm), reference=False))
    assert all(getattr(bare, k) != v for k, v in expected.items())


def test_a_stored_config_without_an_option_means_the_options_default_not_the_reference():
    # a FedPAC run stored before `aggregation` existed ran with the class-count weighting, the
    # option's default, although its reference (PFLlib) is now the uniform mean
    stored = build_config(raw(algorithm="fedpac")).model_dump(mode="json")
    del stored["options"]["aggregation"]
    assert resolved_options(stored)["options"]["aggregation"] == "weighted"
    planned = build_config(raw(algorithm="fedpac")).model_dump(mode="json")
    assert planned["options"]["aggregation"] == "uniform"
    assert config_diff(stored, planned) == ['options.aggregation: "weighted" -> "uniform"']
    as_it_ran = build_config(raw(algorithm="fedpac", options={"aggregation": "weighted"})).model_dump(mode="json")
    assert config_diff(stored, as_it_ran) == []


def test_what_a_run_sets_wins_over_the_reference():
    config = build_config(raw(algorithm="fedbabu", head="all-fc", train={"momentum": 0.5}))
    assert (config.head, config.train.momentum) == (None, 0.5)
    config = build_config(raw(algorithm="fedrema"), ["train.grad_clip=null", "train.momentum=0", "head=last"])
    assert (config.train.grad_clip, config.train.momentum, config.head) == (None, 0.0, "last")
    config = build_config(raw(algorithm="perfedavg", options={"beta": 0.001}))
    assert (config.options["beta"], config.options["steps"]) == (0.001, "pfllib")


def test_a_stored_config_is_read_literally():
    # config.json of a FedBABU run made before references existed: no head, plain SGD
    stored = RunConfig.model_validate(raw(algorithm="fedbabu", train={"momentum": 0.9, "grad_clip": 10.0}))
    data = stored.model_dump(mode="json")
    assert "head" not in data
    again = build_config(data, reference=False)
    assert again == stored and again.head is None  # still the model's own split (both FC layers)
    assert build_config(data).head == "last"  # a new run from the same keys gets the reference split


def test_the_reference_settings_of_every_algorithm_are_valid_options():
    for name, spec in ALGORITHMS.items():
        ref = spec.reference
        assert ref.head in (None, "last", "all-fc") and 0 <= ref.momentum < 1, name
        spec.config(**ref.options)
        assert ref.describe().count(":") >= 1


def test_the_head_flag_and_grad_clip_flag_reach_the_config(tmp_path):
    out = tmp_path / "r"
    result = invoke(
        "run", "--algorithm", "fedavg", "--dataset", "synthetic", "--model", "mlp", "--clients", "4",
        "--rounds", "1", "--head", "last", "--grad-clip", "5", "--set", "dataset_options.num_classes=3", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["grad_clip"] == 5.0 and "head" not in config  # an mlp has one split


# --- the split in runs on cnn2fc (28x28 images, random pixels) -----------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_idx_dataset(tmp_path_factory.mktemp("idx"), 240, 60)


def image_config(images: Path, algorithm: str, **overrides):
    data = raw(
        algorithm=algorithm, data_dir=str(images), partition={"scheme": "iid", "num_clients": 4}, fraction=1.0,
        rounds=2, **overrides,
    )  # fmt: skip
    return build_config(data)


def test_fedavg_ignores_the_split_exactly(images):
    rows_own, own = run(image_config(images, "fedavg"))
    rows_last, last = run(image_config(images, "fedavg", head="last"))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert strip(rows_own) == strip(rows_last)  # the same weights, only their names differ
    assert [v for v in own.server.weights.values()] != [] and all(
        torch.equal(a, b) for a, b in zip(own.server.weights.values(), last.server.weights.values())
    )


@pytest.mark.parametrize("head, frozen", [("last", 5_130), ("all-fc", 529_930)])
def test_fedbabu_freezes_the_head_of_the_split(images, head, frozen):
    config = image_config(images, "fedbabu", head=head)
    assert config.head == (None if head == "all-fc" else "last")
    rt = runtime(config)
    init = rt.workspace.init_weights
    model = rt.workspace.model()
    body = {k: v for k, v in init.items() if k in model.body_keys()}
    answer, _ = fit(rt, 0, body)
    assert sorted(answer.tensors) == sorted(model.body_keys())  # only the body travels
    changed = [k for k in model.body_keys() if not torch.equal(answer.tensors[k], init[k])]
    assert sorted(changed) == sorted(k for k in model.body_keys() if k.endswith(("weight", "bias")))
    trained = model.state_dict()  # the workspace model after the local epochs
    assert all(torch.equal(trained[k], init[k]) for k in model.head_keys())  # the random head stays
    assert sum(init[k].numel() for k in model.head_keys()) == frozen


def test_fedper_and_fedproto_work_on_the_last_layers_input(images):
    config = image_config(images, "fedper")  # reference split: the last FC
    assert config.head == "last"
    rt = runtime(config)
    model = rt.workspace.model()
    assert model.feature_dim == 512 and model.head_keys() == ["head.weight", "head.bias"]
    answer, state = fit(rt, 0, {k: v for k, v in rt.workspace.init_weights.items() if k in model.body_keys()})
    assert sorted(state["head"]) == ["head.bias", "head.weight"]  # the kept personal part: 5,130 parameters
    assert "body.7.weight" in answer.tensors  # FC 512 is shared
    proto = image_config(images, "fedproto")
    _, sim = run(proto.model_copy(update={"rounds": 1}))
    assert sim.server.protos.shape == (10, 512)  # prototypes of FC 512's output, not of the 1024-d convs


def test_every_option_is_written_out_and_old_partial_configs_compare_by_defaults():
    from fedtail.report.runfiles import config_diff

    config = build_config(raw(algorithm="fedac", options={"mu": 1.0}))
    full = config.model_dump(mode="json")
    assert full["options"]["mu"] == 1.0 and full["options"]["lam"] == 0.1 and "first_start" in full["options"]
    # a config.json stored before options were written out in full names only what was set
    old = json.loads(json.dumps(full))
    old["options"] = {"mu": 1.0}
    assert config_diff(old, full) == []
    # an option the old run set to another value than today's default still differs
    old["options"] = {"mu": 1.0, "first_start": "uploaded-mean"}
    assert config_diff(old, full) == ['options.first_start: "uploaded-mean" -> "init"']
