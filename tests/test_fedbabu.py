"""FedBABU: the fixed head, body-only traffic, fine-tuning at evaluation, a run."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.engine.context import ClientContext
from fedtail.components import algorithm_options
from helpers import (
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    evaluate,
    filled,
    fit,
    reply,
    run,
    run_cli,
    runtime,
    set_finetune,
    simulation,
)


def _split(weights: dict, model) -> tuple[dict, dict]:
    body = {k: weights[k] for k in model.body_keys()}
    head = {k: weights[k] for k in model.head_keys()}
    return body, head


# --- training: the head stays the initial one, only bodies travel -------------------------------


def test_client_trains_the_body_only_and_uploads_only_the_body():
    rt = runtime(tiny_config(algorithm="fedbabu"))
    model = rt.workspace.model()
    body, head = _split(rt.workspace.init_weights, model)
    answer, state = fit(rt, 2, body)
    assert answer.tensors.keys() == body.keys()
    assert distance(answer.tensors, body) > 1e-3  # the body trained
    assert_same(_split(model.state_dict(), model)[1], head)  # the head in the workspace did not move
    assert state == {}


def test_head_never_changes_across_rounds_and_never_travels():
    rows, sim = run(tiny_config(algorithm="fedbabu", rounds=4))
    model = sim.server_ctx.model()
    init_body, init_head = _split(sim.server_ctx.init_weights, model)
    glob_body, glob_head = _split(sim.server.global_weights(), model)
    assert_same(glob_head, init_head)
    assert distance(glob_body, init_body) > 1e-3
    assert sim.server.body.keys() == init_body.keys()
    assert sim.server.evaluation_message(0).tensors.keys() == init_body.keys()
    # traffic: one body down and one body up per sampled client and round
    body_bytes = sum(v.numel() * v.element_size() for v in init_body.values())
    fits = sum(len(log["clients"]) for row in rows for log in row["rounds_log"])
    assert rows[-1]["bytes_up"] == rows[-1]["bytes_down"] == fits * body_bytes


def test_server_averages_bodies_weighted_by_samples():
    sim = simulation(tiny_config(algorithm="fedbabu"))
    body = dict(sim.server.body)
    comm = ScriptedComm({0: reply(filled(body, 1.0), 10), 3: reply(filled(body, 4.0), 30)})
    sim.server.run_round(1, [0, 3], comm)
    assert all(m.tensors.keys() == body.keys() for m in comm.sent.values())
    assert all(torch.allclose(v, torch.full_like(v, 3.25)) for v in sim.server.body.values())  # (10·1 + 30·4)/40
    glob = sim.server.global_weights()
    assert glob.keys() == sim.server_ctx.init_weights.keys()


# --- evaluation: fine-tuning ---------------------------------------------------------------------


def test_zero_finetune_epochs_evaluate_the_global_model():
    config = tiny_config(algorithm="fedbabu", finetune={"epochs": 0})
    assert not config.finetune.active
    rt = runtime(config)
    init = rt.workspace.init_weights
    body, _ = _split({k: v + 0.05 for k, v in init.items()}, rt.workspace.model())
    glob = body | {k: init[k] for k in rt.workspace.model().head_keys()}
    for cid in range(3):
        scored = evaluate(rt, cid, body, {})
        plain = _plain_evaluate(rt, cid, glob)
        assert torch.equal(scored.tensors["correct"], plain.tensors["correct"])
        assert scored.metrics["loss_sum"] == plain.metrics["loss_sum"]
    set_finetune(rt, epochs=3)
    tuned = [evaluate(rt, cid, body, {}) for cid in range(3)]
    plain = [_plain_evaluate(rt, cid, glob) for cid in range(3)]
    assert any(not torch.equal(t.tensors["correct"], p.tensors["correct"]) for t, p in zip(tuned, plain))


def _plain_evaluate(rt, cid: int, weights: dict) -> Message:
    """The global model evaluated as FedAvg's clients do."""
    ctx = ClientContext(cid, 1, 0, rt.views.at(1)[cid], rt.workspace, rt.options)
    return ClientHalf().evaluate(Message("evaluate", weights), ctx)


def test_finetuning_is_deterministic_read_only_and_head_mode_keeps_the_body():
    config = tiny_config(algorithm="fedbabu")
    rt = runtime(config)
    model = rt.workspace.model()
    body, head = _split(rt.workspace.init_weights, model)
    first = evaluate(rt, 1, body, {})
    again = evaluate(rt, 1, body, {})  # the same task: the same random stream, the same result
    assert torch.equal(first.tensors["correct"], again.tensors["correct"])
    assert first.metrics["loss_sum"] == again.metrics["loss_sum"]
    # "full" moves the body; "head" fine-tunes the head alone
    assert distance(_split(model.state_dict(), model)[0], body) > 1e-4
    set_finetune(rt, epochs=5, params="head")
    head_only = evaluate(rt, 1, body, {})
    tuned_body, tuned_head = _split(model.state_dict(), model)
    assert_same(tuned_body, body)
    assert distance(tuned_head, head) > 1e-4
    assert head_only.metrics["loss_sum"] != pytest.approx(first.metrics["loss_sum"])


def test_finetuning_improves_local_accuracy_and_leaves_training_alone():
    plain_rows, plain = run(tiny_config(algorithm="fedbabu", rounds=4, finetune={"epochs": 0}))
    tuned_rows, tuned = run(tiny_config(algorithm="fedbabu", rounds=4, finetune={"epochs": 5}))
    assert_same(tuned.server.body, plain.server.body)
    assert [r["global_acc"] for r in tuned_rows] == [r["global_acc"] for r in plain_rows]
    assert tuned_rows[-1]["personalized_acc"] > plain_rows[-1]["personalized_acc"] + 0.05


# --- options, a run, serial = parallel ----------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("finetune.epochs=-1", "--finetune-epochs: Input should be greater than or equal to 0"),
        ("finetune.params=body", "--finetune-params"),
        ("fedbabu.head_lr=0.1", "unknown key; allowed: none"),
    ],
)
def test_bad_settings_are_rejected(assignment, needle):
    assert_config_error("fedbabu", [assignment], needle)


def test_reference_fine_tunes_five_epochs_of_the_whole_model():
    config = tiny_config(algorithm="fedbabu")
    assert (config.finetune.epochs, config.finetune.steps, config.finetune.params) == (5, None, "all")
    assert config.finetune.optimizer == "run" and config.finetune.lr is None
    assert config.model_dump(mode="json")["finetune"]["epochs"] == 5  # written into config.json


def test_configs_stored_with_the_old_options_read_as_the_engine_setting():
    """Runs stored when fine-tuning was FedBABU's options (finetune_epochs, finetune) load, resume
    and compare equal to today's spelling of the same run (fedbabu.migrate)."""
    from fedtail.components import resolved_options
    from fedtail.config import RunConfig
    from fedtail.report.runfiles import config_diff

    today = tiny_config(algorithm="fedbabu", finetune={"epochs": 320, "params": "head"}).model_dump(mode="json")
    old = {**{k: v for k, v in today.items() if k != "finetune"}, "options": {"finetune_epochs": 320, "finetune": "head"}}
    assert RunConfig.model_validate(old).finetune == RunConfig.model_validate(today).finetune
    assert config_diff(old, today) == []
    assert resolved_options(old)["finetune"]["params"] == "head"
    off = {**old, "options": {"finetune_epochs": 0, "finetune": "full"}}
    assert not RunConfig.model_validate(off).finetune.active


def test_runs_end_to_end(tmp_path):
    result = run_cli(tmp_path, "fedbabu", "finetune.params=head")
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert 1 / 5 < result.final["global_acc"] <= 1


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedbabu"))
