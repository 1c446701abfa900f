"""GLDP: prototypes (moving average, global mean), the shared/personal split, the two losses,
nearest-prototype prediction among held classes, the stage bookkeeping, the global model, runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedtail.algorithms.gldp as gldp
from conftest import tiny_config
from fedtail.algorithms.base import Message
from fedtail.algorithms.fedproto import MEANS, PRESENT
from fedtail.algorithms.prototypes import class_target_loss, nearest_prototype_scores
from fedtail.engine.context import load_weights
from fedtail.engine.executors import Task
from fedtail.models import SplitModel, build_model
from fedtail.components import algorithm_options
from helpers import (
    STAGE_SMOKE,
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    reply,
    run,
    run_cli,
    runtime,
    simulation,
    staged,
)

CLASSIFIER = ["head.weight", "head.bias"]  # the mlp's head is its classifier


def fit_at(rt, cid: int, rnd: int, tensors: dict, state: dict) -> tuple[Message, dict]:
    result = rt.run(Task(cid, rnd, 0, Message("fit", tensors), state))
    return result.reply, result.state


def evaluate_at(rt, cid: int, rnd: int, tensors: dict, state: dict) -> Message:
    return rt.run(Task(cid, rnd, 1 << 20, Message("evaluate", tensors), state, read_only=True)).reply


def shared_init(rt) -> dict:
    return {k: v for k, v in rt.workspace.init_weights.items() if k not in CLASSIFIER}


# --- the split -----------------------------------------------------------------------------------


def test_only_the_final_classifier_is_personal_and_z_is_its_input():
    mlp = build_model("mlp", (16,), 5)
    assert gldp.shared_keys(mlp) == mlp.body_keys()
    two_fc = build_model("cnn2fc", (1, 28, 28), 10)  # head: Linear, ReLU, Linear
    assert gldp.shared_keys(two_fc) == two_fc.body_keys() + ["head.0.weight", "head.0.bias"]
    shared_ids = {id(p) for p in gldp.shared_part(two_fc).parameters()}
    assert shared_ids == {id(p) for n, p in two_fc.named_parameters() if not n.startswith("head.2.")}
    features = torch.randn(3, two_fc.feature_dim)
    z = gldp.representation(two_fc, features)
    assert torch.equal(z, torch.relu(two_fc.head[0](features)))
    assert torch.equal(two_fc.classifier(z), two_fc.head(features))


# --- prototypes ----------------------------------------------------------------------------------


def test_local_prototype_moving_average_by_hand():
    old = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    old_present = torch.tensor([True, True, False, False])
    new = torch.tensor([[0.0, 0.0], [4.0, 2.0], [3.0, -1.0], [0.0, 0.0]])
    new_present = torch.tensor([False, True, True, False])
    protos, present = gldp.moving_average(old, old_present, new, new_present, beta=0.25)
    # class 0 kept, class 1 = 0.25·new + 0.75·old, class 2 added as is, class 3 absent
    assert torch.allclose(protos, torch.tensor([[1.0, 1.0], [2.5, 0.5], [3.0, -1.0], [0.0, 0.0]]))
    assert present.tolist() == [True, True, True, False]
    first, first_present = gldp.moving_average(None, None, new, new_present, 0.5)
    assert torch.equal(first, new) and torch.equal(first_present, new_present)


def test_representation_statistics_are_class_means_of_z_in_inference_mode():
    from fedtail.data.base import Dataset, Split

    x = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [2.0, 2.0], [5.0, -1.0]])
    y = torch.tensor([0, 0, 2, 2, 3])
    split = Split(x, y)
    dataset = Dataset("hand", split, split, 4, (2,), mean=(0.0,), std=(1.0,))
    model = SplitModel(nn.Sequential(nn.Dropout(0.5)), nn.Linear(2, 4), 2, 4)  # z = x in eval mode
    model.train()
    stats = gldp.representation_statistics(model, dataset, torch.arange(5), batch_size=2)
    assert model.training
    assert torch.allclose(stats.means, torch.tensor([[2.0, 1.0], [0.0, 0.0], [1.0, 3.0], [5.0, -1.0]]))
    assert stats.present.tolist() == [True, False, True, True]


def test_client_keeps_the_moving_average_of_its_prototypes():
    config = tiny_config(algorithm="gldp", options={"beta": 0.5, "head_epochs": 1})
    rt = runtime(config)
    cid = 2
    start = shared_init(rt)
    first, state = fit_at(rt, cid, 1, start, {})
    assert torch.equal(first.tensors[MEANS], state["protos"])
    held = torch.bincount(rt.workspace.dataset.train.y[rt.views.at(1)[cid].train], minlength=5) > 0
    assert torch.equal(state["present"], held)
    before = state["protos"].clone()
    second, state = fit_at(rt, cid, 2, start, state)
    trained = rt.workspace.model("check")
    load_weights(trained, {k: second.tensors[k] for k in start} | state["classifier"])
    new = gldp.representation_statistics(trained, rt.workspace.dataset, rt.views.at(1)[cid].train).means
    assert torch.allclose(state["protos"][held], 0.5 * new[held] + 0.5 * before[held], atol=1e-6)
    assert not state["protos"][~held].any()


def test_server_global_prototypes_uniform_over_holders_persistent_and_moving():
    sim = simulation(tiny_config(algorithm="gldp", options={"global_beta": 0.5}))
    server = sim.server
    shared = dict(server.shared)
    d = sim.workspace.model().feature_dim

    def upload(values: dict[int, float]) -> dict:
        means, present = torch.zeros(5, d), torch.zeros(5, dtype=torch.bool)
        for c, v in values.items():
            means[c], present[c] = v, True
        return shared | {MEANS: means, PRESENT: present}

    comm = ScriptedComm({1: reply(upload({0: 1.0, 1: 2.0}), 10), 4: reply(upload({0: 3.0, 3: -2.0}), 90)})
    server.run_round(1, [1, 4], comm)
    assert all(MEANS not in m.tensors for m in comm.sent.values())  # round 1: no global prototypes yet
    # uniform over the holders, whatever the clients' sizes
    assert server.present.tolist() == [True, True, False, True, False]
    assert torch.allclose(server.protos[[0, 1, 3]], torch.tensor([2.0, 2.0, -2.0]).unsqueeze(1).expand(3, d))
    assert comm.logged["gldp_classes"] == 3
    comm = ScriptedComm({2: reply(upload({0: 6.0, 2: 5.0}), 10)})
    server.run_round(2, [2], comm)
    assert torch.equal(comm.sent[2].tensors[PRESENT], torch.tensor([True, True, False, True, False]))
    # class 0: 0.5·6 + 0.5·2; class 2 new; classes 1 and 3 (no holder online) kept
    assert torch.allclose(server.protos[:4, 0], torch.tensor([4.0, 2.0, 5.0, -2.0]))
    assert server.present.tolist() == [True, True, True, True, False]


# --- shared layers and the personal classifier -----------------------------------------------


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_shared_layers_are_averaged_and_the_classifier_never_travels(weighting):
    sim = simulation(tiny_config(algorithm="gldp", options={"shared_weighting": weighting}))
    server = sim.server
    assert set(server.shared) == set(sim.server_ctx.init_weights) - set(CLASSIFIER)
    d = sim.workspace.model().feature_dim
    protos = {MEANS: torch.zeros(5, d), PRESENT: torch.ones(5, dtype=torch.bool)}
    replies = {
        0: reply({k: torch.full_like(v, 1.0) for k, v in server.shared.items()} | protos, 10),
        3: reply({k: torch.full_like(v, 4.0) for k, v in server.shared.items()} | protos, 30),
    }
    comm = ScriptedComm(replies)
    server.run_round(1, [0, 3], comm)
    expected = 2.5 if weighting == "uniform" else (10 * 1 + 30 * 4) / 40
    assert all(torch.allclose(v, torch.full_like(v, expected)) for v in server.shared.values())
    assert all(not set(m.tensors) & set(CLASSIFIER) for m in comm.sent.values())
    # the client uploads the shared layers and its prototypes only, and keeps its classifier
    rt = runtime(tiny_config(algorithm="gldp"))
    answer, state = fit_at(rt, 1, 1, shared_init(rt), {})
    assert set(answer.tensors) == set(server.shared) | {MEANS, PRESENT}
    assert set(state["classifier"]) == set(CLASSIFIER)
    assert not torch.equal(state["classifier"]["head.weight"], rt.workspace.init_weights["head.weight"])
    assert "shared" not in state  # no stage tasks: no previous-stage body is ever needed


def test_personal_classifiers_are_never_averaged_in_a_run():
    _, sim = run(tiny_config(algorithm="gldp", rounds=2))
    heads = {c: s["classifier"]["head.weight"] for c, s in sim.client_state.items()}
    assert len(heads) >= 2 and all(not torch.equal(a, b) for a in heads.values() for b in heads.values() if a is not b)
    assert not set(sim.server.shared) & set(CLASSIFIER)


def test_mean_classifier_global_model_uploads_classifiers_only_for_the_server():
    config = tiny_config(algorithm="gldp", rounds=1, options={"global_model": "mean_classifier"})
    rows, sim = run(config)
    participants = rows[-1]["rounds_log"][-1]["clients"]
    mean = torch.stack([sim.client_state[c]["classifier"]["head.weight"] for c in participants]).mean(0)
    weights = sim.server.global_weights()
    assert torch.allclose(weights["head.weight"], mean, atol=1e-6)
    assert_same({k: weights[k] for k in sim.server.shared}, sim.server.shared)
    assert sim.server.evaluation_message(0).tensors.keys().isdisjoint(CLASSIFIER)
    assert rows[-1]["global_acc"] is not None
    none_rows, none_sim = run(config.model_copy(update={"options": {"global_model": "none"}}))
    assert none_sim.server.global_weights() is None and none_rows[-1]["global_acc"] is None


def test_prototype_global_model_is_the_nearest_global_prototype():
    protos = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    present = torch.tensor([True, True, False, True])
    z = torch.tensor([[0.1, 0.1], [1.9, 0.5], [0.2, 2.0], [5.0, 1.0], [0.0, 0.0]])
    weight, bias = gldp.prototype_layer(protos, present)
    logits = z @ weight.T + bias
    scores = nearest_prototype_scores(z, protos, present)
    assert logits.argmax(1).tolist() == scores.argmax(1).tolist() == [0, 1, 3, 1, 0]
    # the same scores up to a per-sample shift ‖z‖²/d, so the same probabilities
    assert torch.allclose(logits[:, present], scores[:, present] + z.pow(2).sum(1, keepdim=True) / 2)
    assert bool((logits[:, 2] < -1e8).all())
    _, sim = run(tiny_config(algorithm="gldp", rounds=1))
    weights = sim.server.global_weights()
    expected = gldp.prototype_layer(sim.server.protos, sim.server.present)
    assert torch.equal(weights["head.weight"], expected[0]) and torch.equal(weights["head.bias"], expected[1])


# --- the losses ----------------------------------------------------------------------------------


def test_glpr_class_weights_formula():
    counts = torch.tensor([10, 30, 0, 5])
    w = gldp.glpr_class_weights(counts)
    # n = 45, J = 3 present classes: w_j = 45 / (3 · n_j)
    assert torch.allclose(w, torch.tensor([1.5, 0.5, 0.0, 3.0]))
    assert float((w * counts).sum()) == pytest.approx(45.0)  # the sample-average weight is 1
    assert torch.equal(gldp.glpr_class_weights(torch.tensor([7, 7, 7])), torch.ones(3))  # balanced: plain MSE
    assert torch.equal(gldp.glpr_class_weights(counts, "none"), torch.ones(4))


def test_glpr_is_the_weighted_distance_to_the_global_prototypes():
    z = torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, 3.0]])
    y = torch.tensor([0, 1, 2])
    targets = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    present = torch.tensor([True, True, False])  # class 2 has no global prototype: adds 0
    ones = torch.ones(3)
    for alignment in ("mse", "l2sq"):
        plain = gldp.weighted_target_loss(z, y, targets, present, ones, alignment)
        assert torch.allclose(plain, class_target_loss(z, y, targets, present, alignment))
    w = torch.tensor([2.0, 0.5, 9.0])
    assert float(gldp.weighted_target_loss(z, y, targets, present, w, "l2sq")) == pytest.approx((2 * 5 + 0.5 * 1) / 3)
    assert float(gldp.weighted_target_loss(z, y, targets, present, w, "mse")) == pytest.approx((2 * 5 + 0.5 * 1) / 6)


def test_lpr_is_zero_for_an_unchanged_body_and_positive_otherwise():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(8, 4, generator=g)
    protos = torch.randn(3, 4, generator=g)
    assert float(gldp.relation_loss(z, z, protos, 0.07)) == pytest.approx(0.0, abs=1e-6)
    assert float(gldp.relation_loss(z, z + 0.3 * torch.randn(8, 4, generator=g), protos, 0.07)) > 1e-3
    # KL(p_old ‖ p_new) by hand, p = softmax_j(cos(z, c_j)/τ)
    z_new = z.flip(0)

    def p_cos(rows):
        cos = torch.stack([torch.cosine_similarity(rows, c.expand_as(rows), dim=1) for c in protos], 1)
        return torch.softmax(cos / 0.5, 1)

    p, q = p_cos(z), p_cos(z_new)
    expected = (p * (p.log() - q.log())).sum(1).mean()
    assert float(gldp.relation_loss(z, z_new, protos, 0.5)) == pytest.approx(float(expected), rel=1e-4)
    # the earlier distance reading, kept as an option: p = softmax_j(−‖z − c_j‖²/τ)
    p = torch.softmax(-torch.cdist(z, protos).pow(2) / 2.0, 1)
    q = torch.softmax(-torch.cdist(z_new, protos).pow(2) / 2.0, 1)
    expected = (p * (p.log() - q.log())).sum(1).mean()
    got = gldp.relation_loss(z, z_new, protos, 2.0, "distance")
    assert float(got) == pytest.approx(float(expected), rel=1e-4)
    # through the training term (default τ = 0.07): the model vs the previous stage's model
    opts = algorithm_options(tiny_config(algorithm="gldp", options={"lam": 0.75}))
    model, old = build_model("mlp", (16,), 5), build_model("mlp", (16,), 5)
    old.load_state_dict(model.state_dict())
    x, y = torch.randn(6, 16, generator=g), torch.arange(6) % 5
    with torch.no_grad():
        protos = old.features(torch.randn(3, 16, generator=g))
    term = gldp.gldp_loss(opts, None, (old.eval(), protos))
    assert float(term(model, x, y, model(x), model.features(x)).detach()) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        model.body[1].weight.add_(0.2 * torch.randn(model.body[1].weight.shape, generator=g))
    value = term(model, x, y, model(x), model.features(x)).detach()
    with torch.no_grad():
        expected = 0.75 * gldp.relation_loss(old.features(x), model.features(x), protos, 0.07)
    assert float(value) > 1e-4 and torch.allclose(value, expected)  # weighted by λ


def test_lpr_stays_bounded_and_scale_free_with_large_features():
    # Regression (fmnist stages diverged: L_LPR 3.7e12 by round 3, NaN at round 4): with raw
    # squared distances / τ the loss and its gradient grew with the features (norms ~20 on
    # cnn-fmnist). Cosine scores / τ give L_LPR ≤ 4/τ and ‖∂L/∂z_i‖ ≤ 2/(B·τ·‖z_i‖) at any scale.
    g = torch.Generator().manual_seed(0)
    tau, batch, dim = 0.07, 16, 64
    z_old = 20 * F.normalize(torch.rand(batch, dim, generator=g), dim=1)  # post-ReLU rows of norm 20
    z = (z_old + 4 * torch.randn(batch, dim, generator=g)).relu()
    protos = 20 * F.normalize(torch.rand(4, dim, generator=g), dim=1)
    reference = float(gldp.relation_loss(z_old, z, protos, tau))
    assert 1e-3 < reference <= 4 / tau
    for scale in (1.0, 50.0):  # rows of norm 20 and 1000
        student = (scale * z).requires_grad_(True)
        loss = gldp.relation_loss(scale * z_old, student, 0.5 * scale * protos, tau)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(reference, rel=1e-4)  # cosine: no scale at all
        bound = 2 / (batch * tau * student.detach().norm(dim=1))
        assert bool(torch.isfinite(student.grad).all())
        assert bool((student.grad.norm(dim=1) <= 1.001 * bound).all())


def test_the_loss_is_lambda_lpr_plus_one_minus_lambda_glpr():
    # the STHFL (GLDP) paper, Sec. 5.4: "When λ = 0 ... only uses the global-local relationship loss";
    # "When λ = 1 ... only local prototype learning in the pre-stage and post-stage".
    g = torch.Generator().manual_seed(1)
    model, old = build_model("mlp", (16,), 5), build_model("mlp", (16,), 5)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    x, y = torch.randn(8, 16, generator=g), torch.arange(8) % 5
    targets, present, weights = torch.randn(5, 64, generator=g), torch.ones(5, dtype=torch.bool), torch.ones(5)
    protos = torch.randn(3, 64, generator=g)
    with torch.no_grad():
        z, z_old = model.features(x), old.features(x)
        glpr = gldp.weighted_target_loss(z, y, targets, present, weights)
        lpr = gldp.relation_loss(z_old, z, protos, 0.07)
    for lam in (0.0, 0.3, 1.0):
        opts = algorithm_options(tiny_config(algorithm="gldp", options={"lam": lam}))
        term = gldp.gldp_loss(opts, (targets, present, weights), (old.eval(), protos))
        with torch.no_grad():
            value = term(model, x, y, model(x), model.features(x))
        assert float(value) == pytest.approx(float(lam * lpr + (1 - lam) * glpr), rel=1e-5)


@pytest.mark.parametrize(
    "options, glpr, lpr",
    [({}, True, True), ({"lam": 0.0}, True, False), ({"lam": 1.0}, False, True),
     ({"glpr": False}, False, True), ({"lpr": False}, True, False), ({"glpr": False, "lpr": False}, False, False)],
)  # fmt: skip
def test_lambda_and_the_ablation_switches_pick_the_loss_terms(monkeypatch, options, glpr, lpr):
    config = staged(algorithm="gldp", options={"head_epochs": 1} | options)
    rt = runtime(config)
    start = shared_init(rt)
    _, state = fit_at(rt, 0, 1, start, {})
    _, state = fit_at(rt, 0, 2, start, state)  # the end of stage 0
    assert ("shared" in state) == lpr  # φ_old is kept only where L_LPR will need it
    seen = {"glpr": 0, "lpr": 0}
    real_glpr, real_lpr = gldp.weighted_target_loss, gldp.relation_loss
    monkeypatch.setattr(gldp, "weighted_target_loss", lambda *a: seen.__setitem__("glpr", 1) or real_glpr(*a))
    monkeypatch.setattr(gldp, "relation_loss", lambda *a: seen.__setitem__("lpr", 1) or real_lpr(*a))
    d = rt.workspace.model().feature_dim
    protos = {MEANS: torch.rand(6, d), PRESENT: torch.ones(6, dtype=torch.bool)}
    fit_at(rt, 0, 3, start | protos, state)  # stage 1, with global prototypes
    assert seen == {"glpr": int(glpr), "lpr": int(lpr)}


def test_global_prototypes_follow_the_local_moving_average_by_default():
    # Eq. 11: the server updates global prototypes "similar as Eq. 9", with the same β
    sim = simulation(tiny_config(algorithm="gldp", options={"beta": 0.25}))
    server, d = sim.server, sim.workspace.model().feature_dim

    def upload(value: float) -> Message:
        means = torch.full((5, d), value)
        return reply(dict(server.shared) | {MEANS: means, PRESENT: torch.tensor([True] * 2 + [False] * 3)}, 10)

    server.run_round(1, [0], ScriptedComm({0: upload(4.0)}))
    server.run_round(2, [1], ScriptedComm({1: upload(8.0)}))
    assert torch.allclose(server.protos[:2], torch.full((2, d), 0.25 * 8 + 0.75 * 4))


# --- the local schedule and the stage bookkeeping ------------------------------------------------


def test_head_then_body_schedule_trains_the_right_parts(monkeypatch):
    config = staged(algorithm="gldp", options={"head_epochs": 3})
    rt = runtime(config)
    calls = []
    real = gldp.train_only

    def spy(ctx, part, frozen, epochs, **args):
        before = ctx.weights()
        stats = real(ctx, part, frozen, epochs, **args)
        after = ctx.weights()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        calls.append(dict(epochs=epochs, changed=changed, loss=getattr(args.get("hook"), "fn", None), samples=stats.samples))
        return stats

    monkeypatch.setattr(gldp, "train_only", spy)
    cid = 1
    start = shared_init(rt)
    _, state = fit_at(rt, cid, 1, start, {})
    n = len(rt.views.at(1)[cid].train)
    shared = set(start)
    assert [c["epochs"] for c in calls] == [3, None]  # head_epochs, then the run's local epochs
    assert calls[0]["changed"] == set(CLASSIFIER) and calls[0]["samples"] == 3 * n
    assert calls[1]["changed"] == shared and calls[1]["samples"] == n
    assert calls[0]["loss"] is None and calls[1]["loss"] is None  # round 1, stage 0: CE only
    # stage 1 with global prototypes: both losses in the body's epochs only
    d = rt.workspace.model().feature_dim
    protos = {MEANS: torch.rand(6, d), PRESENT: torch.ones(6, dtype=torch.bool)}
    calls.clear()
    fit_at(rt, cid, 3, start | protos, state)
    assert calls[0]["loss"] is None and calls[1]["loss"] is not None
    assert calls[0]["changed"] == set(CLASSIFIER) and calls[1]["changed"] == shared


def test_previous_stage_body_and_prototypes_feed_the_relation_loss(monkeypatch):
    config = staged(algorithm="gldp", options={"head_epochs": 1})
    rt = runtime(config)
    cid = 0
    start = shared_init(rt)
    _, state = fit_at(rt, cid, 1, start, {})  # stage 0
    first_shared = state["shared"]
    _, state = fit_at(rt, cid, 2, start, state)  # stage 0, its last round
    assert "old_shared" not in state and state["stage"] == 0
    end_shared, end_protos = state["shared"], state["protos"].clone()
    assert not torch.equal(end_shared["body.1.weight"], first_shared["body.1.weight"])
    seen = []
    real = gldp.relation_loss
    monkeypatch.setattr(gldp, "relation_loss", lambda *a: seen.append(a[2]) or real(*a))
    _, state = fit_at(rt, cid, 3, start, state)  # stage 1: L_LPR against the end of stage 0
    assert_same(state["old_shared"], end_shared)
    assert torch.equal(state["old_protos"], end_protos)
    stage0 = rt.views.at(1)[cid].stage_classes
    assert state["old_present"].nonzero().flatten().tolist() == stage0.tolist()
    assert seen and all(torch.equal(p, end_protos[stage0]) for p in seen)
    _, state = fit_at(rt, cid, 5, start, state)  # stage 2 = the last: nothing more to keep
    assert "shared" not in state and state["stage"] == 2
    assert torch.equal(state["old_present"].nonzero().flatten(), rt.views.at(3)[cid].seen_classes)


def test_nested_stages_keep_the_body_of_the_previous_stage_task_across_rounds_of_global_optimisation():
    config = staged(algorithm="gldp", stage_schedule=None, options={"head_epochs": 1})  # 3 stages, 2 global rounds
    rt = runtime(config)
    start = shared_init(rt)
    state: dict = {}
    ends = {}
    for rnd in range(1, 7):  # client 2 trains every stage task of both rounds of global optimisation
        _, state = fit_at(rt, 2, rnd, start, state)
        if rnd > 1:  # φ_old is what it ended the previous round's stage task with
            assert_same(state["old_shared"], ends[rnd - 1])
        if rnd < 6:
            ends[rnd] = state["shared"]
    assert state["stage"] == 2 and "shared" not in state  # the run's last round: nothing follows
    assert_same(state["old_shared"], ends[5])


# --- prediction ----------------------------------------------------------------------------------


def _fake_ctx(seen: list[int], state: dict | None = None) -> SimpleNamespace:
    data = SimpleNamespace(seen_classes=torch.tensor(seen))
    return SimpleNamespace(num_classes=4, data=data, state=state or {}, device=torch.device("cpu"))


def test_nearest_prototype_prediction_among_held_classes_by_hand():
    model = SplitModel(nn.Sequential(nn.Identity()), nn.Linear(2, 4), 2, 4)  # z = x
    model.eval()
    protos = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    z = torch.tensor([[0.1, 0.1], [1.9, 0.1], [0.1, 1.9], [4.0, 4.0]])
    msg = Message("evaluate", {MEANS: protos, PRESENT: torch.ones(4, dtype=torch.bool)})

    def scores(seen, state=None, message=msg):
        return gldp.prediction(model, message, _fake_ctx(seen, state))(z)

    assert scores([0, 1, 2, 3])["gp"].argmax(1).tolist() == [0, 1, 2, 3]
    assert scores([0, 1])["gp"].argmax(1).tolist() == [0, 1, 0, 1]  # the client holds classes 0 and 1
    # local prototypes from the state; a held class without a prototype is never predicted
    state = {"protos": protos.flip(0), "present": torch.tensor([True, False, True, True])}
    got = scores([0, 1, 2], state)
    assert got["lp"].argmax(1).tolist() == [2, 2, 2, 0]  # class 2's local prototype is (2, 0), class 0's (5, 5)
    assert got["gp"].argmax(1).tolist()[:3] == [0, 1, 2]  # (4, 4) ties classes 1 and 2
    # no prototype yet (none received, none computed): the classifier's scores stand in
    none = scores([0], message=Message("evaluate"))
    assert torch.equal(none["gp"], model.classifier(z)) and torch.equal(none["lp"], model.classifier(z))
    assert torch.equal(got["head"], model.classifier(z))


@pytest.mark.parametrize("predict", ["global", "local"])
def test_client_evaluation_uses_the_prototypes_of_its_seen_classes(predict):
    config = staged(algorithm="gldp", options={"predict": predict, "head_epochs": 1})
    rt = runtime(config)
    cid = 4
    start = shared_init(rt)
    _, state = fit_at(rt, cid, 1, start, {})
    _, state = fit_at(rt, cid, 3, start, state)  # trained in stages 0 and 1
    d = rt.workspace.model().feature_dim
    global_protos = torch.rand(6, d, generator=torch.Generator().manual_seed(3))
    payload = {MEANS: global_protos, PRESENT: torch.ones(6, dtype=torch.bool)} if predict == "global" else {}
    got = evaluate_at(rt, cid, 4, start | payload, state)
    name = gldp.PREDICT_NAMES[predict]
    assert torch.equal(got.tensors["correct"], got.tensors[f"correct:{name}"])
    assert {"correct:gp", "correct:lp", "correct:head"} <= set(got.tensors)
    model = rt.workspace.model("check")
    load_weights(model, start | state["classifier"])
    view = rt.views.at(4)[cid]
    x, y = rt.workspace.dataset.batch(view.eval_split, view.eval_index)
    protos = global_protos if predict == "global" else state["protos"]
    with torch.no_grad():
        dist = torch.cdist(model.features(x), protos).pow(2)
    dist[:, [c for c in range(6) if c not in view.seen_classes.tolist()]] = float("inf")
    hit = dist.argmin(1) == y
    assert torch.equal(got.tensors["correct"], torch.bincount(y[hit], minlength=6))
    assert got.tensors["total"].sum() == len(y)


# --- options, equivalences and runs --------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("gldp.lam=1.5", "--set gldp.lam"),
        ("gldp.tau=0", "--set gldp.tau"),
        ("gldp.relation=euclidean", "--set gldp.relation"),
        ("gldp.beta=0", "--set gldp.beta"),
        ("gldp.global_beta=2", "--set gldp.global_beta"),
        ("gldp.head_epochs=0", "--set gldp.head_epochs"),
        ("gldp.body_epochs=0", "--set gldp.body_epochs"),
        ("gldp.predict=logits", "--set gldp.predict"),
        ("gldp.glpr_weighting=sqrt", "--set gldp.glpr_weighting"),
        ("gldp.global_model=ensemble", "--set gldp.global_model"),
        ("gldp.shared_weighting=cosine", "--set gldp.shared_weighting"),
        ("gldp.glpr=sometimes", "--set gldp.glpr"),
        ("gldp.lpr=2", "--set gldp.lpr"),
        ("gldp.mu=1", "unknown key"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("gldp", [assignment], needle)


def test_without_stages_and_without_glpr_it_is_fedrep_exactly():
    # L_GLPR off and, without stages, L_LPR is 0: FedRep's schedule on the same split (and GLDP's
    # optimizer: plain SGD, no final head fine-tuning, not FedRep's reference settings)
    rep_options = {"head_epochs": 2, "body_epochs": 1, "final_finetune": False}
    plain_sgd = {"momentum": 0.0, "weight_decay": 0.0}
    rep_rows, rep = run(tiny_config(algorithm="fedrep", options=rep_options, train=plain_sgd))
    options = {"glpr": False, "predict": "head", "shared_weighting": "samples", "global_model": "none",
               "head_epochs": 2, "body_epochs": 1}  # fmt: skip
    rows, sim = run(tiny_config(algorithm="gldp", options=options))
    keys = ["personalized_acc", "per_client_acc", "train_loss", "samples_trained"]
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in rep_rows]
    assert_same(sim.server.shared, rep.server.body)
    for cid, state in rep.client_state.items():
        assert_same(sim.client_state[cid]["classifier"], state["head"])
    # so does λ = 1 (only L_LPR, which is 0 without stages); the prototype pull does change training
    lam1_rows, _ = run(tiny_config(algorithm="gldp", options=options | {"glpr": True, "lam": 1.0}))
    assert [[r[k] for k in keys] for r in lam1_rows] == [[r[k] for k in keys] for r in rep_rows]
    _, pulled = run(tiny_config(algorithm="gldp", options=options | {"glpr": True}))
    assert not torch.equal(pulled.server.shared["body.1.weight"], sim.server.shared["body.1.weight"])


def test_predict_changes_evaluation_only_and_one_run_reports_gp_lp_and_head():
    config = staged(algorithm="gldp", options={"head_epochs": 1})
    by_predict = {p: run(config.model_copy(update={"options": {"predict": p, "head_epochs": 1}}))[0]
                  for p in ("global", "local", "head")}  # fmt: skip
    losses = {p: [r["train_loss"] for r in rows] for p, rows in by_predict.items()}
    assert losses["global"] == losses["local"] == losses["head"]
    accs = {p: [r["a_local"] for r in rows] for p, rows in by_predict.items()}
    assert accs["global"] != pytest.approx(accs["local"]) and accs["local"] != pytest.approx(accs["head"])
    # every run carries all three named accuracies; its headline is the one predict names
    for predict, rows in by_predict.items():
        for row, other in zip(rows, by_predict["global"]):
            assert row["named"] == other["named"]
            main = row["named"][gldp.PREDICT_NAMES[predict]]
            assert main["personalized_acc"] == row["personalized_acc"] and main["a_local"] == row["a_local"]
            assert main["a_part"] == row["a_part"]


def test_cli_run_with_stages(tmp_path):
    done = run_cli(tmp_path, "gldp", "gldp.head_epochs=1", smoke=STAGE_SMOKE)
    assert [(r["round"], r["stage"]) for r in done.rows] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    final = done.final
    assert final["a_local"] == final["personalized_acc"] and 0.25 < final["a_local"] <= 1
    assert final["a_global"] is not None and 0 <= final["a_part"] <= 1
    assert all(log["gldp_classes"] >= 1 for log in done.logs)


def test_cli_run_without_stages(tmp_path):
    done = run_cli(tmp_path, "gldp", "gldp.predict=local", "gldp.global_beta=0.5")
    assert 0.2 < done.final["personalized_acc"] <= 1
    assert done.final["global_acc"] is not None
    assert "a_local" not in done.final


def test_serial_and_parallel_agree_with_stages():
    assert_serial_and_parallel_agree(staged(algorithm="gldp", rounds=3, partition={"stages": 3}, eval_every=2))
