"""FedProto: class prototypes, their aggregation, the λ term, nearest-prototype inference, runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import tiny_config
from fedtail.algorithms.fedproto import COUNTS, MEANS, PRESENT
from fedtail.algorithms.prototypes import ClassMean, class_statistics, nearest_prototype_scores
from fedtail.data.base import Dataset, Split
from fedtail.engine.context import load_weights
from fedtail.models import SplitModel
from fedtail.components import algorithm_options
from helpers import (
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    evaluate,
    fit,
    reply,
    run,
    run_cli,
    runtime,
    set_options,
    simulation,
)

# --- hand-made data ----------------------------------------------------------------------------


def vector_dataset(x: torch.Tensor, y: torch.Tensor, num_classes: int) -> Dataset:
    split = Split(x, y)
    return Dataset("hand", split, split, num_classes, (x.shape[1],), mean=(0.0,), std=(1.0,))


def identity_model(dim: int, num_classes: int) -> SplitModel:
    """Body = dropout only (the identity in eval mode), so the features are the inputs."""
    return SplitModel(nn.Sequential(nn.Dropout(0.5)), nn.Linear(dim, num_classes), dim, num_classes)


def test_prototypes_are_the_class_means_of_the_features_in_inference_mode():
    x = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [2.0, 2.0], [9.0, 9.0], [5.0, -1.0]])
    y = torch.tensor([0, 0, 2, 2, 2, 3])
    dataset = vector_dataset(x, y, num_classes=4)
    model = identity_model(2, 4)
    model.train()
    index = torch.tensor([0, 1, 2, 3, 5])  # row 4 is not this client's
    for batch_size in (2, 128):  # batching does not change the means
        stats = class_statistics(model, dataset, index, 4, batch_size=batch_size)
        assert model.training  # mode restored
        assert stats.counts.tolist() == [2, 0, 2, 1]
        assert stats.present.tolist() == [True, False, True, True]
        expected = torch.tensor([[2.0, 1.0], [0.0, 0.0], [1.0, 3.0], [5.0, -1.0]])
        assert torch.allclose(stats.means, expected)  # dropout off: the plain means
        assert stats.means.dtype == torch.float32
        assert stats.sq_norms.tolist() == [1 + 13, 0, 16 + 8, 26]
    logits = class_statistics(model, dataset, index, 4, output="logits")
    with torch.no_grad():
        ref = model.head(x[[0, 1]]).mean(0)
    assert torch.allclose(logits.means[0], ref, atol=1e-6)


def test_global_prototypes_weighted_and_uniform():
    def client_means(rows: dict[int, float]) -> torch.Tensor:
        m = torch.zeros(5, 3)
        for c, v in rows.items():
            m[c] = v
        return m

    a = (client_means({0: 1.0, 1: 2.0}), torch.tensor([10, 30, 0, 0, 0]))
    b = (client_means({0: 3.0, 2: 5.0}), torch.tensor([30, 0, 5, 0, 0]))
    for weighting, class0 in (("weighted", (10 * 1 + 30 * 3) / 40), ("uniform", 2.0)):
        mean = ClassMean(weighting)
        mean.add(*a)
        mean.add(*b)
        protos, present = mean.result()
        assert present.tolist() == [True, True, True, False, False]
        assert torch.allclose(protos[0], torch.full((3,), class0))
        assert torch.allclose(protos[1], torch.full((3,), 2.0)) and torch.allclose(protos[2], torch.full((3,), 5.0))
        assert not protos[3:].any()


@pytest.mark.parametrize("aggregation", ["weighted", "uniform"])
def test_server_aggregates_prototypes_and_sends_them_next_round(aggregation):
    sim = simulation(tiny_config(algorithm="fedproto", options={"aggregation": aggregation}))
    server = sim.server
    d = sim.workspace.model().feature_dim
    means = {1: torch.zeros(5, d), 4: torch.zeros(5, d)}
    means[1][0], means[4][0], means[4][3] = 1.0, 4.0, -2.0
    counts = {1: torch.tensor([3, 0, 0, 0, 0]), 4: torch.tensor([1, 0, 0, 7, 0])}
    comm = ScriptedComm({c: reply({MEANS: means[c], COUNTS: counts[c]}, 10) for c in (1, 4)})
    server.run_round(1, [1, 4], comm)
    assert all(m.tensors == {} for m in comm.sent.values())  # round 1: no prototypes yet, CE only
    class0 = (3 * 1 + 1 * 4) / 4 if aggregation == "weighted" else 2.5
    assert torch.allclose(server.protos[0], torch.full((d,), class0))
    assert torch.allclose(server.protos[3], torch.full((d,), -2.0))
    assert server.present.tolist() == [True, False, False, True, False]
    assert comm.logged["fedproto_classes"] == 2
    before = server.protos
    server.run_round(2, [1, 4], comm)
    assert all(torch.equal(m.tensors[MEANS], before) for m in comm.sent.values())
    sent = comm.sent[1].tensors
    assert sent[PRESENT].tolist() == [True, False, False, True, False]
    assert torch.allclose(sent[MEANS][0], torch.full((d,), class0))


@pytest.mark.parametrize("keep_absent", [True, False])
def test_a_class_no_participant_holds_keeps_its_prototype_unless_told_otherwise(keep_absent):
    sim = simulation(tiny_config(algorithm="fedproto", options={"keep_absent": keep_absent}))
    server = sim.server
    d = sim.workspace.model().feature_dim
    first = {1: (torch.ones(5, d), torch.tensor([2, 0, 0, 3, 0]))}  # classes 0 and 3
    second = {4: (torch.full((5, d), 7.0), torch.tensor([0, 0, 0, 4, 0]))}  # class 3 only
    for rnd, uploads in ((1, first), (2, second)):
        comm = ScriptedComm({c: reply({MEANS: m, COUNTS: n}, 10) for c, (m, n) in uploads.items()})
        server.run_round(rnd, list(uploads), comm)
    assert torch.allclose(server.protos[3], torch.full((d,), 7.0))  # replaced by this round's holder
    if keep_absent:
        assert server.present.tolist() == [True, False, False, True, False]
        assert torch.allclose(server.protos[0], torch.ones(d))  # kept from round 1
    else:
        assert server.present.tolist() == [False, False, False, True, False]
        assert not server.protos[0].any()


# --- the client --------------------------------------------------------------------------------


def test_client_uploads_prototypes_and_counts_never_weights():
    rt = runtime(tiny_config(algorithm="fedproto", options={"prototypes": "trained"}))
    cid = 2
    answer, state = fit(rt, cid, {})
    assert set(answer.tensors) == {MEANS, COUNTS}
    labels = rt.workspace.dataset.train.y[rt.views.at(1)[cid].train]
    assert torch.equal(answer.tensors[COUNTS], torch.bincount(labels, minlength=5))
    # the prototypes are those of the trained model the client keeps
    model = rt.workspace.model("check")
    load_weights(model, state["weights"])
    stats = class_statistics(model, rt.workspace.dataset, rt.views.at(1)[cid].train, 5)
    assert torch.equal(answer.tensors[MEANS], stats.means)
    assert not torch.equal(state["weights"]["head.weight"], rt.workspace.init_weights["head.weight"])


def test_training_prototypes_are_the_mean_of_the_training_batches_features():
    config = tiny_config(algorithm="fedproto", train={"local_epochs": 2})  # the reference: prototypes=training
    assert algorithm_options(config).prototypes == "training"
    rt = runtime(config)
    cid = 2
    answer, state = fit(rt, cid, {})
    index = rt.views.at(1)[cid].train
    labels = rt.workspace.dataset.train.y[index]
    assert torch.equal(answer.tensors[COUNTS], 2 * torch.bincount(labels, minlength=5))  # every sample, each epoch
    model = rt.workspace.model("check")
    load_weights(model, state["weights"])
    after = class_statistics(model, rt.workspace.dataset, index, 5)
    held = after.present
    # the features of a changing model, not those of the trained one
    assert float((answer.tensors[MEANS][held] - after.means[held]).abs().max()) > 1e-4
    # ... and the same training as with prototypes=trained (recording adds nothing to the loss)
    set_options(rt, config, prototypes="trained")
    trained_answer, trained_state = fit(rt, cid, {})
    assert_same(trained_state["weights"], state["weights"])
    assert torch.equal(trained_answer.tensors[MEANS], after.means)


def test_recording_adds_the_features_and_keeps_the_loss():
    from fedtail.algorithms.fedproto import recording
    from fedtail.algorithms.prototypes import ClassStats

    record = ClassStats.zeros(3, 2, "cpu")
    f = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])
    y = torch.tensor([0, 0, 2])
    zero = recording(None, record)(None, None, y, None, f)
    assert float(zero) == 0 and record.counts.tolist() == [2, 0, 1]
    assert torch.equal(record.means, torch.tensor([[2.0, 3.0], [0.0, 0.0], [5.0, 0.0]]))
    loss = recording(lambda m, x, y, logits, features: features.sum(), record)(None, None, y, None, f)
    assert float(loss) == 15 and record.counts.tolist() == [4, 0, 2]
    assert recording(None, None) is None


def test_the_lambda_term_pulls_features_to_the_global_prototypes():
    config = tiny_config(algorithm="fedproto", train={"local_epochs": 2})
    rt = runtime(config)
    d = rt.workspace.model().feature_dim
    targets = torch.rand(5, d, generator=torch.Generator().manual_seed(0))  # reachable after a ReLU
    present = torch.tensor([True, True, True, True, False])
    gap = {}
    for options in ({"lam": 0.0}, {"lam": 1.0, "alignment": "l2sq"}, {"lam": 20.0, "alignment": "mse"}):
        rt.options = algorithm_options(config.model_copy(update={"options": options}))
        answer, _ = fit(rt, 3, {MEANS: targets, PRESENT: present})
        held = (answer.tensors[COUNTS] > 0) & present
        gap[options.get("alignment")] = float((answer.tensors[MEANS][held] - targets[held]).pow(2).sum())
    assert gap["l2sq"] < 0.5 * gap[None]
    assert gap["mse"] < 0.6 * gap[None]  # mse divides by the feature size: the same pull needs λ·d


def test_lambda_zero_with_head_prediction_is_local_training_exactly():
    local_rows, local = run(tiny_config(algorithm="local"))
    rows, proto = run(tiny_config(algorithm="fedproto", options={"lam": 0.0, "predict": "head"}))
    accuracy = ["personalized_acc", "per_client_acc", "per_class_acc", "train_loss", "samples_trained"]
    assert [[r[k] for k in accuracy] for r in rows] == [[r[k] for k in accuracy] for r in local_rows]
    assert local.client_state.keys() == proto.client_state.keys()
    for cid, state in local.client_state.items():
        assert_same(proto.client_state[cid]["weights"], state["weights"])
    # the λ term does change training from round 2 on
    _, pulled = run(tiny_config(algorithm="fedproto", options={"predict": "head"}))
    assert any(
        not torch.equal(pulled.client_state[c]["weights"]["head.weight"], s["weights"]["head.weight"])
        for c, s in local.client_state.items()
    )


def test_nearest_prototype_scores_by_hand():
    protos = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.0, 3.0]])  # class 2: absent (zero row)
    present = torch.tensor([True, True, False, True])
    features = torch.tensor([[0.1, 0.1], [1.9, 0.5], [0.2, 2.0], [5.0, 1.0]])
    scores = nearest_prototype_scores(features, protos, present)
    assert scores.argmax(1).tolist() == [0, 1, 3, 1]
    assert torch.allclose(scores[0, :2], -torch.tensor([0.02, 3.62]) / 2)
    assert bool(torch.isfinite(scores).all())
    assert bool((scores[:, 2] < scores[:, [0, 1, 3]].min(1).values).all())  # never the absent class
    full = nearest_prototype_scores(features, protos[[0, 1, 3]], torch.ones(3, dtype=torch.bool))
    assert torch.allclose(full, scores[:, [0, 1, 3]])


def test_client_predicts_the_class_of_the_nearest_global_prototype():
    rt = runtime(tiny_config(algorithm="fedproto"))
    cid = 1
    _, state = fit(rt, cid, {})
    d = rt.workspace.model().feature_dim
    protos = torch.randn(5, d, generator=torch.Generator().manual_seed(1))
    present = torch.tensor([True, False, True, True, True])
    got = evaluate(rt, cid, {MEANS: protos, PRESENT: present}, state)
    model = rt.workspace.model("check")
    load_weights(model, state["weights"])
    model.eval()
    view = rt.views.at(1)[cid]
    x, y = rt.workspace.dataset.batch(view.eval_split, view.eval_index)
    with torch.no_grad():
        dist = torch.cdist(model.features(x), protos).pow(2)
    dist[:, ~present] = float("inf")
    hit = dist.argmin(1) == y
    assert torch.equal(got.tensors["correct"], torch.bincount(y[hit], minlength=5))
    assert got.tensors["correct"][1] == 0  # no prototype, never predicted
    # without prototypes (predict = head), the client's own classifier
    head = evaluate(rt, cid, {}, state)
    with torch.no_grad():
        head_hit = model(x).argmax(1) == y
    assert torch.equal(head.tensors["correct"], torch.bincount(y[head_hit], minlength=5))
    assert not torch.equal(head.tensors["correct"], got.tensors["correct"])


# --- options and runs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fedproto.lam=-1", "--set fedproto.lam"),
        ("fedproto.predict=logits", "--set fedproto.predict"),
        ("fedproto.aggregation=max", "--set fedproto.aggregation"),
        ("fedproto.alignment=l1", "--set fedproto.alignment"),
        ("fedproto.mu=1", "unknown key"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("fedproto", [assignment], needle)


def test_uplink_is_prototypes_only_and_evaluation_uses_them():
    config = tiny_config(algorithm="fedproto")
    rows, sim = run(config)
    d = sim.workspace.model().feature_dim
    per_reply = 5 * d * 4 + 5 * 8  # float32 prototypes + int64 counts
    assert sim.meter.bytes_up == config.rounds * config.clients_per_round * per_reply
    assert rows[-1]["global_acc"] is None
    head_rows, _ = run(tiny_config(algorithm="fedproto", options={"predict": "head"}))
    assert [r["train_loss"] for r in head_rows] == [r["train_loss"] for r in rows]  # same training
    assert [r["personalized_acc"] for r in head_rows] != pytest.approx([r["personalized_acc"] for r in rows])


def test_cli_run(tmp_path):
    result = run_cli(tmp_path, "fedproto", "fedproto.aggregation=uniform")
    assert 0.2 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    assert all(log["fedproto_classes"] >= 1 for log in result.logs)


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedproto"))
