"""FedDistill: per-label mean logits, the server's (self-excluding) average, the λ term, runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from fedtail.algorithms.feddistill import COUNTS, MEANS, PRESENT, TEACHER, distill_divergence, distill_loss
from fedtail.algorithms.prototypes import ClassStats, class_statistics
from fedtail.engine.context import load_weights
from fedtail.components import algorithm_options
from helpers import (
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    fit,
    reply,
    run,
    run_cli,
    runtime,
    simulation,
)

# --- the client's logit means ------------------------------------------------------------------


def test_distillation_term_by_hand_and_logit_recording():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 4.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 2, 0])
    teacher = torch.tensor([[1.0, 0.0, 0.0], [0.0, 3.0, 0.0], [9.0, 9.0, 9.0]])
    present = torch.tensor([True, True, False])  # label 2 has no teacher
    # mse: over batch × classes, the sample without a teacher adding 0
    mse = (1 + 4 + 1) / 12
    assert float(distill_divergence(logits, y, teacher, present, "mse")) == pytest.approx(mse)
    # kl: KL(softmax(teacher_y) ‖ softmax(logits)) per sample, mean over the batch
    kl = sum(
        float(F.kl_div(F.log_softmax(logits[i], 0), F.softmax(teacher[y[i]], 0), reduction="sum"))
        for i in (0, 1, 3)
    ) / 4
    assert float(distill_divergence(logits, y, teacher, present, "kl")) == pytest.approx(kl, rel=1e-6)
    # the extra loss is λ·φ and records every batch's logits per label
    record = ClassStats.zeros(3, 3, "cpu")
    term = distill_loss((teacher, present), 0.5, "kl", record)
    assert float(term(None, None, y, logits)) == pytest.approx(0.5 * kl, rel=1e-6)
    term(None, None, y[:2], logits[:2])
    assert record.counts.tolist() == [3, 2, 1]
    assert torch.allclose(record.means[1], torch.tensor([0.0, 1.0, 0.0]))
    assert torch.allclose(record.means[0], torch.tensor([4.0, 0.0, 0.0]) / 3)
    assert torch.allclose(record.means[2], torch.tensor([1.0, 1.0, 4.0]))
    # nothing to add and nothing to record: no extra loss at all; λ = 0 while recording adds 0
    assert distill_loss(None, 1.0, "kl") is None and distill_loss((teacher, present), 0.0, "mse") is None
    zero = distill_loss((teacher, present), 0.0, "kl", ClassStats.zeros(3, 3, "cpu"))(None, None, y, logits)
    assert float(zero) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("source", ["training", "inference"])
def test_client_uploads_mean_logits_per_label_never_weights(source):
    config = tiny_config(algorithm="feddistill", train={"local_epochs": 2}, options={"logits": source})
    rt = runtime(config)
    cid = 4
    answer, state = fit(rt, cid, {})
    assert set(answer.tensors) == {MEANS, COUNTS}
    labels = rt.workspace.dataset.train.y[rt.views.at(1)[cid].train]
    held = torch.bincount(labels, minlength=5)
    model = rt.workspace.model("check")
    load_weights(model, state["weights"])
    after = class_statistics(model, rt.workspace.dataset, rt.views.at(1)[cid].train, 5, output="logits")
    if source == "inference":
        assert torch.equal(answer.tensors[COUNTS], held)
        assert torch.equal(answer.tensors[MEANS], after.means)
    else:  # every logit of both epochs, from the model as it trained
        assert torch.equal(answer.tensors[COUNTS], 2 * held)
        load_weights(model, rt.workspace.init_weights)
        before = class_statistics(model, rt.workspace.dataset, rt.views.at(1)[cid].train, 5, output="logits")
        got = answer.tensors[MEANS][held > 0]
        assert not torch.allclose(got, after.means[held > 0], atol=1e-3)
        # the running mean lies between the start and the end of training, roughly
        assert (got - after.means[held > 0]).norm() < (before.means[held > 0] - after.means[held > 0]).norm()


# --- the server --------------------------------------------------------------------------------


def uploads() -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Three clients' mean logits (5 labels × 5 logits, each row constant) and counts."""
    rows = {1: {0: 1.0, 1: 2.0}, 2: {0: 3.0}, 4: {0: 8.0, 3: -1.0}}
    counts = {1: [10, 5, 0, 0, 0], 2: [30, 0, 0, 0, 0], 4: [10, 0, 0, 2, 0]}
    out = {}
    for cid, labels in rows.items():
        m = torch.zeros(5, 5)
        for label, value in labels.items():
            m[label] = value
        out[cid] = (m, torch.tensor(counts[cid]))
    return out


@pytest.mark.parametrize("aggregation", ["weighted", "uniform"])
@pytest.mark.parametrize("exclude_self", [True, False])
def test_server_average_with_and_without_self_exclusion(exclude_self, aggregation):
    options = {"exclude_self": exclude_self, "aggregation": aggregation}
    server = simulation(tiny_config(algorithm="feddistill", options=options)).server
    comm = ScriptedComm({c: reply({MEANS: m, COUNTS: n}, 10) for c, (m, n) in uploads().items()} | {
        3: reply({MEANS: torch.zeros(5, 5), COUNTS: torch.zeros(5, dtype=torch.int64)}, 10)
    })
    server.run_round(1, [1, 2, 4], comm)
    assert all(m.tensors == {} for m in comm.sent.values())  # round 1: CE only
    server.run_round(2, [1, 2, 3], comm)
    sent = {cid: m.tensors for cid, m in comm.sent.items()}
    w = aggregation == "weighted"

    def label0(cids):  # expected teacher row of label 0 over these uploaders
        vals = {1: (1.0, 10), 2: (3.0, 30), 4: (8.0, 10)}
        num = sum(vals[c][0] * (vals[c][1] if w else 1) for c in cids)
        return num / sum(vals[c][1] if w else 1 for c in cids)

    if exclude_self:
        assert sent[1][TEACHER][0, 0] == pytest.approx(label0([2, 4]))
        assert sent[2][TEACHER][0, 0] == pytest.approx(label0([1, 4]))
        assert sent[1][PRESENT].tolist() == [True, False, False, True, False]  # only client 1 held label 1
        assert sent[2][PRESENT].tolist() == [True, True, False, True, False]
        assert sent[2][TEACHER][1, 0] == pytest.approx(2.0)
    else:
        for cid in (1, 2):
            assert sent[cid][TEACHER][0, 0] == pytest.approx(label0([1, 2, 4]))
            assert sent[cid][PRESENT].tolist() == [True, True, False, True, False]
    # client 3 did not upload last round: it gets the average of everybody
    assert sent[3][TEACHER][0, 0] == pytest.approx(label0([1, 2, 4]))
    assert torch.allclose(sent[3][TEACHER][3], torch.full((5,), -1.0))
    # round 3 is built from round 2's uploads only
    server.run_round(3, [1], comm)
    if exclude_self:
        assert comm.sent[1].tensors[TEACHER][0, 0] == pytest.approx(3.0)
        assert not comm.sent[1].tensors[PRESENT][3]  # client 4's label 3 is gone


# --- training ----------------------------------------------------------------------------------


def test_lambda_zero_is_local_training_exactly():
    local_rows, local = run(tiny_config(algorithm="local"))
    rows, distill = run(tiny_config(algorithm="feddistill", options={"lam": 0.0}))
    accuracy = ["personalized_acc", "per_client_acc", "per_class_acc", "train_loss", "samples_trained"]
    assert [[r[k] for k in accuracy] for r in rows] == [[r[k] for k in accuracy] for r in local_rows]
    for cid, state in local.client_state.items():
        assert_same(distill.client_state[cid]["weights"], state["weights"])
    assert rows[-1]["bytes_up"] == 3 * 3 * (5 * 5 * 4 + 5 * 8)  # mean logits and counts only
    assert rows[-1]["global_acc"] is None
    # λ > 0 changes training from round 2 on, for either regulariser
    for regularizer in ("kl", "mse"):
        _, pulled = run(tiny_config(algorithm="feddistill", options={"regularizer": regularizer}))
        assert any(
            not torch.equal(pulled.client_state[c]["weights"]["head.weight"], s["weights"]["head.weight"])
            for c, s in local.client_state.items()
        )


def test_distillation_pulls_the_clients_logits_towards_the_teacher():
    config = tiny_config(algorithm="feddistill", train={"local_epochs": 3}, options={"logits": "inference"})
    rt = runtime(config)
    teacher = torch.full((5, 5), -2.0)
    teacher[:, 4] = 2.0  # every label's teacher says "class 4"
    message = {TEACHER: teacher, PRESENT: torch.ones(5, dtype=torch.bool)}
    share = {}
    for lam in (0.0, 3.0):
        rt.options = algorithm_options(config.model_copy(update={"options": {"lam": lam, "logits": "inference"}}))
        answer, _ = fit(rt, 0, message)
        held = answer.tensors[COUNTS] > 0
        share[lam] = float(F.softmax(answer.tensors[MEANS][held], 1)[:, 4].mean())
    assert share[3.0] > share[0.0] + 0.1


# --- options and runs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("feddistill.lam=-0.5", "--set feddistill.lam"),
        ("feddistill.regularizer=l1", "--set feddistill.regularizer"),
        ("feddistill.exclude_self=maybe", "--set feddistill.exclude_self"),
        ("feddistill.aggregation=median", "--set feddistill.aggregation"),
        ("feddistill.logits=test", "--set feddistill.logits"),
        ("feddistill.temperature=2", "unknown key"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("feddistill", [assignment], needle)


def test_cli_run(tmp_path):
    result = run_cli(tmp_path, "feddistill", "feddistill.regularizer=mse", "feddistill.exclude_self=false")
    assert 0.2 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="feddistill"))
