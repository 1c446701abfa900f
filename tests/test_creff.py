"""Federated features (CReFF / MuPFL's PKCF) and the CReFF algorithm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import tiny_config
from fedtail.algorithms.base import Message
from fedtail.algorithms.creff import GRADS, RETRAINED, CReFFConfig, classifier_names, set_linear
from fedtail.algorithms.federated_features import (
    FederatedFeatures,
    class_draws,
    class_gradients,
    linear_ce_gradients,
    mean_class_gradients,
    pack_class_gradients,
    train_classifier,
    unpack_class_gradients,
)
from fedtail.data.synthetic import load_synthetic
from fedtail.engine import prepare
from fedtail.engine.context import derive_seed, load_weights
from fedtail.engine.executors import ClientRuntime, Task
from fedtail.errors import ConfigError
from fedtail.models import SplitModel
from fedtail.components import algorithm_options
from helpers import assert_serial_and_parallel_agree, run, simulation, strip_timing

# --- helpers -----------------------------------------------------------------------------------


def tiny_model(deep_head: bool, dim: int = 6, num_classes: int = 4) -> SplitModel:
    torch.manual_seed(3)
    body = nn.Sequential(nn.Linear(dim, 12), nn.ReLU(), nn.Dropout(0.5))  # dropout: eval mode must be used
    if deep_head:
        head = nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, num_classes))
    else:
        head = nn.Linear(12, num_classes)
    return SplitModel(body, head, 12, num_classes)


def client_index(dataset, counts: dict[int, int]) -> torch.Tensor:
    """The first counts[c] training rows of each class c."""
    y = dataset.train.y
    return torch.cat([(y == c).nonzero().flatten()[:n] for c, n in counts.items()])


def creff_config(**overrides):
    options = {"num_features": 8, "match_iterations": 5, "retrain_epochs": 3, "grad_repeats": 2, "grad_batch": 8}
    return tiny_config(algorithm="creff", options=options | overrides.pop("options", {}), **overrides)


# --- class gradients ---------------------------------------------------------------------------


@pytest.mark.parametrize("deep_head", [False, True])
def test_class_gradients_equal_direct_autograd(deep_head):
    dataset = load_synthetic(num_classes=4, dim=6, train_per_class=60, test_per_class=5)
    model = tiny_model(deep_head)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # class 0 has more samples than a draw, class 1 fewer, class 2 none
    index = client_index(dataset, {0: 50, 1: 5, 3: 20})
    repeats, batch = 3, 8
    grads, present = class_gradients(
        model, dataset, index, 4, torch.Generator().manual_seed(7), repeats=repeats, batch_size=batch
    )
    assert present.tolist() == [True, True, False, True]
    assert grads["weight"].shape == (4, *model.classifier.weight.shape)
    assert grads["bias"].shape == (4, 4)
    assert not grads["weight"][2].any() and not grads["bias"][2].any()

    labels = dataset.train.y[index]
    draws = class_draws(labels, 4, torch.Generator().manual_seed(7), repeats=repeats, batch_size=batch)
    assert sorted(draws) == [0, 1, 3]
    model.eval()
    params = [model.classifier.weight, model.classifier.bias]
    for c, d in draws.items():
        assert d.shape == (repeats, min(batch, int((labels == c).sum())))
        assert all(len(set(row.tolist())) == d.shape[1] for row in d)  # distinct samples per draw
        assert bool((labels[d] == c).all())
        ref_w, ref_b = torch.zeros_like(params[0]), torch.zeros_like(params[1])
        for row in d:
            x, y = dataset.batch(dataset.train, index[row])
            gw, gb = torch.autograd.grad(F.cross_entropy(model(x), y), params)
            ref_w += gw / repeats
            ref_b += gb / repeats
        assert torch.allclose(grads["weight"][c], ref_w, atol=1e-6), c
        assert torch.allclose(grads["bias"][c], ref_b, atol=1e-6), c
    assert grads["weight"][0].abs().sum() > 0
    # the model is untouched: weights, mode, no stray .grad
    model.train()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_class_gradients_restore_mode_and_handle_no_samples():
    dataset = load_synthetic(num_classes=4, dim=6, train_per_class=10, test_per_class=5)
    model = tiny_model(False)
    model.train()
    grads, present = class_gradients(model, dataset, torch.empty(0, dtype=torch.int64), 4, torch.Generator())
    assert model.training
    assert not present.any() and not grads["weight"].any()


def test_closed_form_linear_gradient_equals_autograd():
    g = torch.Generator().manual_seed(0)
    layer = nn.Linear(5, 3)
    h = torch.randn(7, 5, generator=g, requires_grad=True)
    y = torch.randint(0, 3, (7,), generator=g)
    gw, gb = linear_ce_gradients(layer.weight, layer.bias, h, y)
    rw, rb = torch.autograd.grad(F.cross_entropy(layer(h), y), [layer.weight, layer.bias], create_graph=True)
    assert torch.allclose(gw, rw, atol=1e-6) and torch.allclose(gb, rb, atol=1e-6)
    # and its derivative w.r.t. the features (what matching differentiates) agrees too
    probe = torch.randn(3, 5, generator=g)
    (a,) = torch.autograd.grad((gw * probe).sum() + gb.sum(), h)
    (b,) = torch.autograd.grad((rw * probe).sum() + rb.sum(), h)
    assert torch.allclose(a, b, atol=1e-6)


# --- aggregation -------------------------------------------------------------------------------


def test_mean_class_gradients_averages_only_over_holders():
    C = 4

    def client(value: float, classes: list[int]):
        present = torch.zeros(C, dtype=torch.bool)
        present[classes] = True
        w = torch.zeros(C, 2, 3)
        b = torch.zeros(C, 2)
        w[present], b[present] = value, -value
        return {"weight": w, "bias": b}, present

    items = [client(1.0, [0, 1]), client(3.0, [1]), client(8.0, [0, 3])]
    mean, present = mean_class_gradients(items)
    assert present.tolist() == [True, True, False, True]
    assert torch.allclose(mean["weight"][0], torch.full((2, 3), 4.5))  # (1 + 8) / 2, not / 3
    assert torch.allclose(mean["weight"][1], torch.full((2, 3), 2.0))  # (1 + 3) / 2
    assert torch.allclose(mean["weight"][3], torch.full((2, 3), 8.0))
    assert torch.allclose(mean["bias"][1], torch.full((2,), -2.0))
    assert not mean["weight"][2].any()
    assert mean["weight"].dtype == torch.float32

    # the wire format keeps present rows only and round-trips
    packed = pack_class_gradients(*items[2], prefix="g.")
    assert packed["g.weight"].shape == (2, 2, 3) and packed["g.classes"].tolist() == [0, 3]
    grads, again = unpack_class_gradients(packed, C, prefix="g.")
    assert torch.equal(again, items[2][1])
    assert all(torch.equal(grads[k], items[2][0][k]) for k in ("weight", "bias"))


# --- matching ----------------------------------------------------------------------------------


def planted(C=4, D=10, seed=0):
    """Real gradients induced by hidden per-class feature clouds under a fixed classifier."""
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(C, D, generator=g) * 0.3)
        layer.bias.zero_()
    centers = torch.randn(C, D, generator=g) * 2
    w, b = [], []
    for c in range(C):
        h = centers[c] + torch.randn(50, D, generator=g)
        gw, gb = linear_ce_gradients(layer.weight, layer.bias, h, torch.full((50,), c))
        w.append(gw)
        b.append(gb)
    return layer, {"weight": torch.stack(w), "bias": torch.stack(b)}


def test_matching_loss_is_the_double_backward_cosine_loss():
    layer, real = planted()
    C, m = 4, 6
    present = torch.tensor([True, False, True, True])
    feats = FederatedFeatures(C, 10, m, torch.Generator().manual_seed(1))
    x = feats.features.clone().requires_grad_(True)
    ours = feats.loss(layer, real, present, x)

    # The authors' formulation: autograd gradient with create_graph, per class, then cosine distances.
    ref = torch.zeros(())
    params = [layer.weight, layer.bias]
    for c in range(C):
        if not present[c]:
            continue
        f = x[c * m : (c + 1) * m]
        gw, gb = torch.autograd.grad(F.cross_entropy(layer(f), torch.full((m,), c)), params, create_graph=True)
        rw, rb = real["weight"][c], real["bias"][c]
        ref = ref + (1 - (gw * rw).sum(-1) / (gw.norm(dim=-1) * rw.norm(dim=-1) + 1e-6)).sum()
        ref = ref + (1 - (gb * rb).sum() / (gb.norm() * rb.norm() + 1e-6))
    assert torch.allclose(ours, ref, atol=1e-5)
    (a,) = torch.autograd.grad(ours, x)
    (b,) = torch.autograd.grad(ref, x)
    assert torch.allclose(a, b, atol=1e-5)
    assert not a[m : 2 * m].any()  # absent class: no gradient


def test_match_lowers_its_loss_and_leaves_absent_classes():
    layer, real = planted()
    present = torch.tensor([True, True, False, True])
    feats = FederatedFeatures(4, 10, 20, torch.Generator().manual_seed(1), lr=0.1, iterations=60)
    start = feats.features.clone()
    classifier = layer.weight.detach().clone()
    before, after = feats.match(layer, real, present)
    with torch.no_grad():
        assert before == pytest.approx(float(feats.loss(layer, real, present, start)))
        assert after == pytest.approx(float(feats.loss(layer, real, present)))
    assert after < 0.5 * before
    assert torch.equal(feats.features[40:60], start[40:60])  # class 2 untouched
    assert not torch.equal(feats.features[:20], start[:20])
    assert torch.equal(layer.weight, classifier)  # the classifier is only read
    # a second call continues from the matched features
    again, _ = feats.match(layer, real, present)
    assert again == pytest.approx(after)


@pytest.mark.parametrize("present", [[True, True, True, True], [True, False, True, True]])
def test_match_step_is_sgd_on_the_autograd_gradient_of_the_loss(present):
    """The closed-form step (every class present, or some) equals x - lr * autograd's ∂L/∂x."""
    layer, real = planted()
    present = torch.tensor(present)
    feats = FederatedFeatures(4, 10, 6, torch.Generator().manual_seed(2), lr=0.5, iterations=1, init_std=1.0)
    x = feats.features.clone().requires_grad_(True)
    loss = feats.loss(layer, real, present, x)
    (grad,) = torch.autograd.grad(loss, x)
    expected = (x - 0.5 * grad).detach()
    assert grad.abs().max() > 1e-3  # the step moves the features: the comparison below means something
    before, _ = feats.match(layer, real, present)
    assert before == pytest.approx(float(loss), rel=1e-5)
    assert torch.allclose(feats.features, expected, atol=1e-6, rtol=1e-5)


def test_federated_features_state_round_trip():
    a = FederatedFeatures(3, 5, 4, torch.Generator().manual_seed(0))
    assert a.features.shape == (12, 5) and a.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    b = FederatedFeatures(3, 5, 4, torch.Generator().manual_seed(1))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    with pytest.raises(ValueError):
        FederatedFeatures(3, 5, 2, torch.Generator()).load_state_dict(a.state_dict())


def test_feature_init_std_scales_the_initial_draw():
    unit = FederatedFeatures(3, 50, 4, torch.Generator().manual_seed(0))
    small = FederatedFeatures(3, 50, 4, torch.Generator().manual_seed(0), init_std=0.1)
    assert torch.allclose(small.features, unit.features * 0.1)
    assert 0.8 < float(unit.features.std()) < 1.2


# --- re-training -------------------------------------------------------------------------------


def test_train_classifier_learns_separable_features_and_touches_nothing_else():
    g = torch.Generator().manual_seed(0)
    C, D = 5, 12
    centers = torch.randn(C, D, generator=g) * 4
    labels = torch.arange(C).repeat_interleave(40)
    features = centers[labels] + torch.randn(len(labels), D, generator=g)
    features_before = features.clone()
    model = tiny_model(False, dim=D, num_classes=C)  # classifier: Linear(12, 5) after the body
    body_before = {k: v.clone() for k, v in model.body.state_dict().items()}
    classifier_before = model.classifier.weight.clone()
    accuracy = lambda: float((model.classifier(features).argmax(1) == labels).float().mean())  # noqa: E731
    assert accuracy() < 0.9
    train_classifier(model.classifier, features, labels, epochs=20, batch_size=16, lr=0.05, generator=g)
    assert accuracy() > 0.95
    assert not torch.equal(model.classifier.weight, classifier_before)
    assert torch.equal(features, features_before)
    assert all(torch.equal(v, body_before[k]) for k, v in model.body.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_train_classifier_is_plain_sgd():
    """Same batches as torch.optim.SGD (no momentum) on the cross-entropy: same weights."""
    g = torch.Generator().manual_seed(0)
    features = torch.randn(50, 6, generator=g)
    labels = torch.randint(0, 3, (50,), generator=g)
    ours, ref = nn.Linear(6, 3), nn.Linear(6, 3)
    ref.load_state_dict(ours.state_dict())
    shuffle = torch.Generator().manual_seed(5)
    train_classifier(ours, features, labels, epochs=3, batch_size=16, lr=0.2, generator=shuffle)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    shuffle = torch.Generator().manual_seed(5)
    for _ in range(3):
        for batch in torch.randperm(50, generator=shuffle).split(16):
            opt.zero_grad()
            F.cross_entropy(ref(features[batch]), labels[batch]).backward()
            opt.step()
    assert torch.allclose(ours.weight, ref.weight, atol=1e-5)
    assert torch.allclose(ours.bias, ref.bias, atol=1e-5)


# --- the algorithm -----------------------------------------------------------------------------


def test_creff_defaults_and_validation():
    opts = CReFFConfig()
    # the validated matching lr and initial scale (benchmarks/mupfl/README.md), the rest the authors'
    assert (opts.num_features, opts.match_iterations, opts.match_lr, opts.feature_init_std) == (100, 100, 100.0, 0.1)
    assert (opts.retrain_epochs, opts.retrain_batch, opts.retrain_lr) == (300, 32, 0.01)
    assert (opts.grad_repeats, opts.grad_batch) == (10, 32)
    with pytest.raises(ConfigError):
        creff_config(options={"num_feature": 3})


def test_feature_init_std_option_reaches_the_server_features():
    unit = simulation(creff_config(options={"feature_init_std": 1.0}))
    small = simulation(creff_config(options={"feature_init_std": 0.01}))
    try:
        assert torch.allclose(small.server.features.features, unit.server.features.features * 0.01)
    finally:
        unit.executor.close()
        small.executor.close()
    with pytest.raises(ConfigError):
        creff_config(options={"feature_init_std": 0})


def test_creff_evaluates_fedavg_body_with_retrained_classifier():
    rows, sim = run(creff_config(rounds=2))
    server = sim.server
    fedavg, evaluated = server.weights, server.global_weights()
    model = sim.workspace.model()
    cls_keys = set(model.classifier_keys())
    assert cls_keys
    for key in fedavg:
        if key in cls_keys:
            assert not torch.equal(evaluated[key], fedavg[key]), key
        else:
            assert torch.equal(evaluated[key], fedavg[key]), key
    w, b = server.keys
    assert torch.equal(evaluated[w], server.retrained["weight"]) and torch.equal(evaluated[b], server.retrained["bias"])
    msg = server.evaluation_message(0)
    assert all(torch.equal(msg.tensors[k], evaluated[k]) for k in evaluated)
    # the reported global accuracy is the re-trained model's
    from fedtail.engine.training import evaluate

    model = sim.workspace.model("check")
    model.load_state_dict(evaluated)
    counts = evaluate(model, sim.dataset, sim.dataset.test, None, sim.dataset.num_classes)
    assert rows[-1]["global_acc"] == pytest.approx(counts.accuracy)
    for log in rows[-1]["rounds_log"]:
        assert log["creff_match_loss_after"] < log["creff_match_loss_before"]
        assert log["creff_classes"] >= 1


def test_creff_is_deterministic():
    config = creff_config(rounds=2)
    r1, s1 = run(config)
    r2, s2 = run(config)
    assert strip_timing(r1) == strip_timing(r2)
    assert torch.equal(s1.server.features.features, s2.server.features.features)
    assert all(torch.equal(v, s2.server.weights[k]) for k, v in s1.server.weights.items())


def test_creff_serial_and_parallel_agree():
    s1, s2 = assert_serial_and_parallel_agree(creff_config(rounds=2))
    assert torch.equal(s1.server.features.features, s2.server.features.features)


def test_creff_features_persist_across_rounds_and_resume():
    config = creff_config(rounds=3)
    full = simulation(config)
    resumed = simulation(config)
    tampered = simulation(config)
    try:
        initial = full.server.features.features.clone()
        for rnd in (1, 2, 3):
            full.run_round(rnd)
            if rnd == 1:
                after_one = full.server.features.features.clone()
        state = full.server.state_dict()
        C, m = full.dataset.num_classes, algorithm_options(config).num_features
        assert state["features"]["features"].shape == (C * m, full.server.linear.in_features)
        assert torch.equal(state["features"]["features"], full.server.features.features)
        assert not torch.equal(after_one, initial)

        # resume after round 2 from the saved server state gives round 3 exactly
        helper = simulation(config)
        try:
            helper.run_round(1)
            helper.run_round(2)
            saved = helper.server.state_dict()
        finally:
            helper.executor.close()
        resumed.server.load_state_dict(saved)
        resumed.run_round(3)
        assert torch.equal(resumed.server.features.features, full.server.features.features)
        assert torch.equal(resumed.server.retrained["weight"], full.server.retrained["weight"])

        # round 2 starts from round 1's features: changing them changes what round 2 produces
        tampered.run_round(1)
        tampered.server.features.features += 0.5
        tampered.run_round(2)
        assert not torch.allclose(tampered.server.features.features, saved["features"]["features"])
    finally:
        for sim in (full, resumed, tampered):
            sim.executor.close()


def test_creff_client_gradients_use_received_body_and_retrained_classifier_before_training():
    config = creff_config(options={"grad_batch": 4})  # draws smaller than the classes: random
    dataset, partition = prepare(config)
    runtime = ClientRuntime(config, dataset, partition)
    C = dataset.num_classes
    weights = runtime.workspace.init_weights
    model = runtime.workspace.model("reference")
    w, b = classifier_names(model)
    g = torch.Generator().manual_seed(11)
    retrained = {"weight": torch.randn(weights[w].shape, generator=g) * 5, "bias": torch.randn(C, generator=g)}
    message = Message("fit", weights | {RETRAINED + name: value for name, value in retrained.items()})
    cid, rnd = 2, 4
    result = runtime.run(Task(cid, rnd, 0, message, {}))
    got, present = unpack_class_gradients(result.reply.tensors, C, prefix=GRADS)

    load_weights(model, weights)
    set_linear(model.classifier, retrained["weight"], retrained["bias"])
    generator = torch.Generator().manual_seed(derive_seed(config.seed, rnd, 0, cid))  # the task's stream, unused yet
    ref, ref_present = class_gradients(model, dataset, runtime.views.at(1)[cid].train, C, generator, repeats=2, batch_size=4)
    assert torch.equal(present, ref_present) and present.any()
    assert torch.allclose(got["weight"], ref["weight"], atol=1e-6)
    assert torch.allclose(got["bias"], ref["bias"], atol=1e-6)
    # local training started from FedAvg's classifier, not from the re-trained one
    trained = result.reply.tensors[w]
    assert not torch.equal(trained, weights[w])
    assert (trained - weights[w]).abs().max() < (trained - retrained["weight"]).abs().max()
    assert set(result.reply.tensors) == set(weights) | {GRADS + "weight", GRADS + "bias", GRADS + "classes"}
