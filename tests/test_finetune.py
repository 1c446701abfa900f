"""Fine-tuning before evaluation (RunConfig.finetune): one engine setting for every algorithm."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_config
from fedtail.config import FinetuneConfig
from helpers import assert_config_error, assert_same, distance, evaluate, run, run_cli, runtime, set_finetune


def test_default_is_off_and_left_out_of_config_json():
    config = tiny_config()
    assert not config.finetune.active
    assert "finetune" not in config.model_dump(mode="json")  # configs of earlier runs stay as they were


def test_any_algorithm_fine_tunes_the_evaluated_model_not_the_training():
    plain_rows, plain = run(tiny_config(rounds=3))
    tuned_rows, tuned = run(tiny_config(rounds=3, finetune={"epochs": 2}))
    assert_same(tuned.server.global_weights(), plain.server.global_weights())  # training untouched
    assert [r["global_acc"] for r in tuned_rows] == [r["global_acc"] for r in plain_rows]
    assert [r["train_loss"] for r in tuned_rows] == [r["train_loss"] for r in plain_rows]
    assert tuned_rows[-1]["personalized_acc"] > plain_rows[-1]["personalized_acc"]  # local adaptation pays


def test_fine_tuning_is_deterministic_and_writes_no_state():
    config = tiny_config(algorithm="ditto", finetune={"epochs": 1})
    rt = runtime(config)
    weights = rt.workspace.init_weights
    personal = {k: v + 0.01 for k, v in weights.items()}
    state = {"personal": personal}
    first = evaluate(rt, 2, weights, state)
    again = evaluate(rt, 2, weights, state)
    assert first.metrics["loss_sum"] == again.metrics["loss_sum"]
    assert_same(state["personal"], {k: v + 0.01 for k, v in weights.items()})  # the client's state as it was


def test_head_only_keeps_the_body_and_steps_count_batches():
    config = tiny_config(algorithm="fedavg")
    rt = runtime(config)
    model = rt.workspace.model()
    weights = rt.workspace.init_weights
    body = {k: weights[k] for k in model.body_keys()}
    head = {k: weights[k] for k in model.head_keys()}
    set_finetune(rt, epochs=1, params="head")
    evaluate(rt, 0, weights, {})
    state = model.state_dict()
    assert_same({k: state[k] for k in body}, body)
    assert distance({k: state[k] for k in head}, head) > 1e-5
    set_finetune(rt, steps=1, optimizer="plain", lr=0.5)
    one_step = evaluate(rt, 0, weights, {})
    set_finetune(rt, steps=3, optimizer="plain", lr=0.5)
    assert evaluate(rt, 0, weights, {}).metrics["loss_sum"] != pytest.approx(one_step.metrics["loss_sum"])


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("finetune.epochs=-1", "--finetune-epochs"),
        ("finetune.lr=0", "--finetune-lr: Input should be greater than 0"),
        ("finetune.optimizer=adam", "--finetune-optimizer"),
        ("finetune.rounds=2", "unknown key; allowed: epochs, lr, optimizer, params, steps"),
    ],
)
def test_bad_settings_are_rejected(assignment, needle):
    assert_config_error("fedavg", [assignment], needle)


def test_epochs_and_steps_exclude_each_other():
    with pytest.raises(ValueError, match="set one of them"):
        FinetuneConfig(epochs=2, steps=3)


def test_flags_reach_the_config(tmp_path):
    result = run_cli(tmp_path, "fedavg", flags=["--finetune-epochs", "1", "--finetune-params", "head"])
    stored = json.loads((result.out / "config.json").read_text())
    assert stored["finetune"]["epochs"] == 1 and stored["finetune"]["params"] == "head"
    assert 0 < result.final["personalized_acc"] <= 1
