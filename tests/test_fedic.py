"""FEDIC: calibrated ensemble distillation on the server's data."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from fedtail.algorithms.fedic import (
    COUNTS,
    calibrated_logits,
    distil,
    draw_batches,
    ensemble_weights,
    fit_gate,
    init_gate,
    kd_loss,
    outputs,
    prior_adjust,
)
from fedtail.errors import ConfigError
from helpers import (
    assert_config_error,
    assert_fails_in_one_line,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    fit,
    invoke_run,
    run,
    run_cli,
    runtime,
    simulation,
    strip_timing,
)

SERVER = {"server_samples_per_class": 8, "server_unlabelled": 60, "imbalance": 5.0}
FAST = {"distill_steps": 8, "finetune_steps": 8, "gate_steps": 8, "unlabelled_batch": 32}


def fedic_config(options=None, **overrides):
    partition = SERVER | overrides.pop("partition", {})
    return tiny_config(algorithm="fedic", partition=partition, options=FAST | (options or {}), **overrides)


def gate_for(num_classes: int, dim: int, **values) -> dict:
    gate = init_gate(num_classes, dim, torch.Generator().manual_seed(0))
    return gate | {k: torch.as_tensor(v, dtype=torch.float32) for k, v in values.items()}


# --- the calibrated ensemble on hand-made logits -------------------------------------------------


def test_prior_adjust_is_laplace_smoothed_logit_adjustment():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    counts = torch.tensor([7, 0, 1])  # π = (8, 1, 2) / 11
    out = prior_adjust(logits, counts, tau=2.0)
    expected = logits - 2.0 * torch.log(torch.tensor([8 / 11, 1 / 11, 2 / 11]))
    assert torch.allclose(out, expected)
    assert torch.equal(prior_adjust(logits, counts, tau=0.0), logits)


def test_ensemble_weights():
    z = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]])  # K=2 clients, n=1 sample, C=2
    assert torch.equal(ensemble_weights(z, {}, "uniform"), torch.full((2, 1), 0.5))
    gate = {"ensemble_scale": torch.tensor([1.0, -1.0]), "ensemble_bias": torch.tensor([0.5])}
    raw = torch.sigmoid(torch.tensor([2.5, -0.5]))  # σ(z_k·s + b_s)
    assert torch.allclose(ensemble_weights(z, gate, "gated")[:, 0], raw / raw.sum())


def test_log_space_weights_equal_the_sigmoid_quotient_where_it_is_finite():
    g = torch.Generator().manual_seed(0)
    z = 4 * torch.randn(6, 50, 5, generator=g)  # K=6 clients, 50 samples: a_k roughly in ±25
    gate = {"ensemble_scale": torch.randn(5, generator=g), "ensemble_bias": torch.tensor([0.3])}
    gate = {k: v.requires_grad_(True) for k, v in gate.items()}
    a = z @ gate["ensemble_scale"] + gate["ensemble_bias"]
    assert float(a.detach().abs().max()) > 15  # the σ's differ by orders of magnitude
    quotient = torch.sigmoid(a) / torch.sigmoid(a).sum(0, keepdim=True)  # the formula as written
    weights = ensemble_weights(z, gate, "gated")
    assert torch.allclose(weights, quotient, rtol=1e-5, atol=1e-7)
    assert torch.allclose(weights.sum(0), torch.ones(50), atol=1e-6)
    # the same gradients too (what fitting the gate sees)
    probe = torch.randn(6, 50, generator=g)
    grads = torch.autograd.grad((weights * probe).sum(), list(gate.values()))
    expected = torch.autograd.grad((quotient * probe).sum(), list(gate.values()))
    assert all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(grads, expected))


def test_ensemble_weights_survive_sigmoid_underflow():
    # Regression (fmnist stages: Σ_j σ(a_j) fell 2.3 → 5e-16 → 0.0, the gate was NaN from round 4):
    # where every σ(a_k) is 0 in float32 the quotient is 0/0; log σ(a) ≈ a gives softmax_k(a_k).
    z = torch.tensor([[[-200.0, 0.0], [-1000.0, 0.0]], [[-201.0, 0.0], [-990.0, 0.0]]])  # K=2, n=2, C=2
    gate = {"ensemble_scale": torch.tensor([1.0, 0.0]), "ensemble_bias": torch.tensor([0.0])}
    weights = ensemble_weights(z, gate, "gated")
    assert bool(torch.isfinite(weights).all())
    expected = torch.softmax(torch.tensor([[-200.0, -1000.0], [-201.0, -990.0]]), dim=0)
    assert torch.allclose(weights, expected, rtol=1e-4, atol=1e-6)  # [e/(1+e), 1/(1+e)], then ≈ [0, 1]
    # ... and fitting the gate on such logits keeps it finite (a NaN gate persists across rounds)
    n, C, K = 40, 3, 4
    labels = torch.arange(n) % C
    logits = -300.0 + 5 * F.one_hot(labels, C).float().expand(K, n, C)  # every a_k ≈ −900
    gate = gate_for(C, 5)
    fitted, losses = fit_gate(gate, logits, torch.randn(n, 5), torch.zeros(n, C), labels,
                              draw_batches(n, 20, 5, torch.Generator().manual_seed(0), torch.device("cpu")), lr=0.01, weighting="gated")
    assert all(math.isfinite(x) for x in losses)
    assert all(bool(torch.isfinite(v).all()) for v in fitted.values())


def test_calibrated_logits_by_hand():
    z = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]])
    anchor = torch.tensor([[0.0, 5.0]])
    h = torch.tensor([[1.0, 2.0, 0.0]])
    gate = gate_for(2, 3, ensemble_scale=[0.0, 0.0], ensemble_bias=[0.0], logit_scale=[2.0, 1.0],
                    logit_bias=[0.5, -0.5], gate_weight=[1.0, -1.0, 3.0], gate_bias=[0.25])
    g = torch.sigmoid(torch.tensor(1.0 - 2.0 + 0.25))
    ensemble = torch.tensor([1.0, 0.5])  # σ(0) weights: the plain mean
    expected = g * (torch.tensor([2.0, 1.0]) * ensemble + torch.tensor([0.5, -0.5])) + (1 - g) * anchor
    assert torch.allclose(calibrated_logits(gate, z, h, anchor, "gated"), expected)
    # An open gate gives the adjusted ensemble alone, a closed one the calibration model alone.
    opened = gate | {"gate_bias": torch.tensor([50.0])}
    closed = gate | {"gate_bias": torch.tensor([-50.0])}
    assert torch.allclose(calibrated_logits(opened, z, h, anchor, "uniform"), torch.tensor([[2.5, 0.0]]))
    assert torch.allclose(calibrated_logits(closed, z, h, anchor, "uniform"), anchor)


def test_initial_gate_is_the_identity_calibration():
    gate = init_gate(4, 6, torch.Generator().manual_seed(1))
    z = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(2))
    mean = z.mean(0)
    # α = 1, β = 0: with the mean as the anchor, whatever the gate opens to, the result is the mean.
    assert torch.allclose(calibrated_logits(gate, z, torch.randn(5, 6), mean, "uniform"), mean, atol=1e-6)


def test_fitting_the_gate_removes_a_head_class_bias():
    torch.manual_seed(0)
    n, C, K = 60, 3, 4
    labels = torch.arange(n) % C
    # Every client's logits point to the true class, but all are biased towards class 0.
    z = 1.0 * F.one_hot(labels, C).float().expand(K, n, C) + torch.tensor([2.0, 0.0, 0.0]) + 0.1 * torch.randn(K, n, C)
    anchor = torch.zeros(n, C)  # an uninformative calibration model
    features = torch.randn(n, 5)
    gate = gate_for(C, 5, gate_bias=[3.0])
    before = calibrated_logits(gate, z, features, anchor, "gated").argmax(1).eq(labels).float().mean()
    batches = draw_batches(n, 20, 120, torch.Generator().manual_seed(0), torch.device("cpu"))
    fitted, losses = fit_gate(gate, z, features, anchor, labels, batches, lr=0.1, weighting="gated")
    after = calibrated_logits(fitted, z, features, anchor, "gated").argmax(1).eq(labels).float().mean()
    assert before < 0.5 and float(after) == pytest.approx(1.0)
    assert losses[-1] < 0.5 * losses[0]
    assert fitted["logit_bias"][0] < fitted["logit_bias"][1:].min()  # the learned adjustment lowers class 0


# --- distillation ------------------------------------------------------------------------------


def test_distillation_lowers_the_kl_to_the_teacher_on_the_server_data():
    sim = simulation(fedic_config())
    data, dataset = sim.server_ctx.server_data, sim.dataset
    model = sim.server_ctx.model("fedic-student")
    model.load_state_dict(sim.server_ctx.init_weights)
    index = data.unlabelled
    teacher = F.softmax(3 * torch.randn(len(index), 5, generator=torch.Generator().manual_seed(4)), dim=1)

    def kl() -> float:
        z, _ = outputs(model, dataset, data.split, index, features=False)
        return float(kd_loss(z, teacher, 2.0))

    before = kl()
    generator = torch.Generator().manual_seed(0)
    batches = draw_batches(len(index), 32, 60, generator, index.device)
    kls = distil(model, dataset, data.split, index, teacher, batches, data.labelled, [],
                 lr=0.01, weight_decay=0.0, weight=1.0, temperature=2.0)
    assert kl() < 0.7 * before
    assert sum(kls[-10:]) < sum(kls[:10])


def test_a_round_logs_its_server_training():
    rows, sim = run(fedic_config(options={"distill_steps": 30, "finetune_steps": 30, "gate_steps": 30}, rounds=2))
    for log in (log for row in rows for log in row["rounds_log"]):
        assert log["fedic_kl_last"] < log["fedic_kl_first"]
        assert log["fedic_finetune_loss_last"] < log["fedic_finetune_loss_first"]
    assert not torch.equal(sim.server.gate["logit_scale"], torch.ones(5))  # the gate was fitted and kept


def test_distillation_off_equals_fedavg_exactly():
    for options in ({"distill_steps": 0}, {"distill_steps": 0, "prior_tau": 1.0}):
        fedic_rows, fedic = run(fedic_config(options=options))
        fedavg_rows, fedavg = run(tiny_config(partition=SERVER))
        assert strip_timing(fedic_rows) == strip_timing(fedavg_rows)
        assert_same(fedic.server.global_weights(), fedavg.server.global_weights())


def test_distillation_changes_the_fedavg_model():
    _, fedic = run(fedic_config(rounds=1))
    _, fedavg = run(tiny_config(partition=SERVER, rounds=1))
    assert fedic.server.global_weights().keys() == fedavg.server.global_weights().keys()
    assert distance(fedic.server.global_weights(), fedavg.server.global_weights()) > 0


def test_the_plain_ensemble_teacher_needs_no_labelled_set():
    config = fedic_config(options={"teacher": "ensemble", "distill_weight": 1.0},
                          partition={"server_samples_per_class": 0}, rounds=1)
    rows, _ = run(config)
    log = rows[0]["rounds_log"][0]
    assert "fedic_gate_loss_first" not in log and "fedic_kl_first" in log  # distilled, with no gate to train


def test_clients_upload_their_class_counts_only_for_the_prior_adjustment():
    config = fedic_config(options={"prior_tau": 1.0})
    rt = runtime(config)
    reply, _ = fit(rt, 2, rt.workspace.init_weights)
    counts = torch.bincount(rt.workspace.dataset.train.y[rt.views.at(1)[2].train], minlength=5)
    assert torch.equal(reply.tensors[COUNTS], counts)
    plain = runtime(fedic_config())
    reply, _ = fit(plain, 2, plain.workspace.init_weights)
    assert COUNTS not in reply.tensors
    rows, _ = run(config.model_copy(update={"rounds": 1}))  # the server strips the counts before averaging
    assert rows[0]["global_acc"] is not None


# --- options, errors, end to end ---------------------------------------------------------------


def test_option_errors():
    assert_config_error("fedic", ["fedic.temperature=0"], "fedic.temperature")
    assert_config_error("fedic", ["fedic.distill_weight=1.5"], "fedic.distill_weight")
    assert_config_error("fedic", ["fedic.distill_steps=-1"], "fedic.distill_steps")
    assert_config_error("fedic", ["fedic.teacher=mean"], "fedic.teacher")
    assert_config_error("fedic", ["fedic.prior_tau=-1"], "fedic.prior_tau")


def test_missing_server_data_is_a_config_error():
    with pytest.raises(ConfigError, match="partition.server_unlabelled"):
        simulation(tiny_config(algorithm="fedic"))
    with pytest.raises(ConfigError, match="partition.server_samples_per_class"):
        simulation(fedic_config(partition={"server_samples_per_class": 0}))
    simulation(tiny_config(algorithm="fedic", options={"distill_steps": 0}))  # FedAvg needs no server data


def test_cli_run(tmp_path):
    result = run_cli(tmp_path, "fedic", "partition.server_samples_per_class=5", "partition.server_unlabelled=40",
                     *(f"fedic.{k}={v}" for k, v in FAST.items()))
    assert result.final["global_acc"] is not None
    assert "fedic_kl_first" in result.logs[0]
    partition = json.loads((result.out / "partition.json").read_text())
    assert partition["server"]["labelled_counts"] == [5] * 5
    assert sum(partition["server"]["unlabelled_counts"]) == 40
    # Without server data the run stops with one line, before its folder is written.
    assert_fails_in_one_line(invoke_run(tmp_path / "bad", "fedic"), "partition.server_unlabelled")
    assert not (tmp_path / "bad").exists()


def test_serial_and_parallel_agree():
    serial, parallel = assert_serial_and_parallel_agree(fedic_config(rounds=2))
    assert_same(serial.server.global_weights(), parallel.server.global_weights())
