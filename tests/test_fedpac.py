"""FedPAC: collaboration statistics, the simplex QP, feature alignment, head-then-body, runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config
from fedtail.algorithms.fedpac import (
    PRIOR_PROTOS,
    VARIANCE,
    collaboration_matrix,
    collaboration_statistics,
    combination_weights,
    simplex_qp,
    train_body,
)
from fedtail.algorithms.fedproto import COUNTS, MEANS, PRESENT
from fedtail.algorithms.fedrep import train_only
from fedtail.algorithms.prototypes import ClassStats, alignment_loss, class_statistics, class_target_loss
from fedtail.engine.context import ClientContext, derive_seed, load_weights
from helpers import (
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    filled,
    fit,
    reply,
    run_cli,
    runtime,
    simulation,
)

class HistoryComm(ScriptedComm):
    """A scripted channel that keeps every call's (kind, messages)."""

    def __init__(self, replies):
        super().__init__(replies)
        self.calls = []

    def stream(self, messages):
        self.calls.append((next(iter(messages.values())).kind, dict(messages)))
        yield from super().stream(messages)


# --- statistics and the quadratic program --------------------------------------------------------


def test_collaboration_statistics_by_hand():
    stats = ClassStats.zeros(3, 2, "cpu")
    stats.add(torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]]), torch.tensor([0, 0, 2]))
    v, h = collaboration_statistics(stats)
    # p = (2/3, 0, 1/3), μ_0 = (2, 1), μ_2 = (0, 4), E‖φ‖² = 7 and 16:
    # V = (2/3·7 − 4/9·5 + 1/3·16 − 1/9·16) / 3 = 2
    assert float(v) == pytest.approx(2.0)
    assert torch.allclose(h, torch.tensor([[4 / 3, 2 / 3], [0.0, 0.0], [0.0, 4 / 3]], dtype=torch.float64))
    # one class, identical features: no variance at all
    same = ClassStats.zeros(2, 2, "cpu")
    same.add(torch.ones(4, 2), torch.zeros(4, dtype=torch.int64))
    assert float(collaboration_statistics(same)[0]) == pytest.approx(0.0, abs=1e-12)


def test_collaboration_matrix_is_variance_plus_prototype_gram():
    v = torch.tensor([0.5, 1.0, 2.0])
    h = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[2.0, 2.0]]])  # 3 clients, 1 class, d = 2
    q = collaboration_matrix(v, h, 0)
    # Δ_j = h_0 − h_j: (0, 0), (1, −1), (−1, −2)
    expected = np.diag([0.5, 1.0, 2.0]) + np.array([[0, 0, 0], [0, 2, 1], [0, 1, 5]])
    assert np.allclose(q, expected)
    alpha = np.array([0.2, 0.3, 0.5])
    mixed = (h * torch.tensor(alpha, dtype=torch.float32).view(3, 1, 1)).sum(0)
    direct = 0.5 * 0.04 + 1.0 * 0.09 + 2.0 * 0.25 + float((mixed - h[0]).pow(2).sum())
    assert alpha @ q @ alpha == pytest.approx(direct)  # Σ α_j² V_j + ‖Σ α_j h_j − h_k‖²


@pytest.mark.parametrize("seed", range(4))
def test_qp_solution_is_on_the_simplex_and_optimal(seed):
    g = torch.Generator().manual_seed(seed)
    m = 6
    v = torch.rand(m, generator=g) * 0.5
    h = torch.randn(m, 4, 3, generator=g)
    q = collaboration_matrix(v, h, seed % m)
    alpha, ok = simplex_qp(q)
    assert ok
    assert (alpha >= 0).all() and alpha.sum() == pytest.approx(1.0)

    def objective(a):
        return a @ q @ a

    assert objective(alpha) <= objective(np.full(m, 1 / m)) + 1e-12
    assert all(objective(alpha) <= objective(np.eye(m)[j]) + 1e-12 for j in range(m))
    # KKT: equal gradients on the support, no smaller gradient off it
    grad = 2 * q @ alpha
    support = alpha > 1e-6
    level = grad[support].mean()
    scale = np.abs(q).max()
    assert np.allclose(grad[support], level, atol=1e-4 * scale)
    assert (grad[~support] >= level - 1e-4 * scale).all()


def test_weights_favour_the_identical_peer():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    h = torch.stack([a, a.clone(), b])
    v = torch.full((3,), 0.1)
    weights = combination_weights(v, h, min_weight=1e-3)
    assert np.allclose(weights.sum(1), 1) and (weights >= 0).all()
    for k, peer in ((0, 1), (1, 0)):
        assert weights[k, peer] > weights[k, 2]
        assert weights[k, 2] == pytest.approx(0.0, abs=1e-12)  # far peer under the floor
        assert weights[k, k] == pytest.approx(0.5) and weights[k, peer] == pytest.approx(0.5)
    assert weights[2].argmax() == 2  # the odd one out mostly keeps itself
    # without the floor the far peer keeps its (tiny) optimal weight: α ∝ 1/Q_jj on a diagonal Q
    raw = combination_weights(v, h, min_weight=0.0)
    far = 1 / (0.1 + float((a - b).pow(2).sum()))
    assert raw[0, 2] == pytest.approx(far / (2 / 0.1 + far), rel=1e-3)


# --- the client ----------------------------------------------------------------------------------


def test_feature_alignment_term_by_hand():
    features = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]], requires_grad=True)
    y = torch.tensor([0, 1, 0])
    protos = torch.tensor([[1.0, 0.0], [5.0, 5.0], [7.0, 7.0]])
    present = torch.tensor([True, False, True])  # label 1: no global prototype
    # squared distances: 4, (none), 4 + 1
    assert float(class_target_loss(features, y, protos, present, "mse").detach()) == pytest.approx(9 / 6)
    assert float(class_target_loss(features, y, protos, present, "l2sq").detach()) == pytest.approx(9 / 3)
    term = alignment_loss(protos, present, 2.0, "l2sq")(None, None, y, None, features)
    assert float(term.detach()) == pytest.approx(6.0)
    (grad,) = torch.autograd.grad(term, features)
    assert torch.allclose(grad, 2.0 * 2 * (features.detach() - protos[y]) * present[y].unsqueeze(1) / 3)
    assert not grad[1].any()


@pytest.mark.parametrize("missing", ["skip", "local"])
def test_head_then_body_schedule_trains_the_right_parts(missing):
    config = tiny_config(algorithm="fedpac", train={"local_epochs": 2}, options={"missing_prototype": missing})
    rt = runtime(config)
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    body = {k: init[k] + 0.01 for k in model.body_keys()}
    d = model.feature_dim
    protos = torch.rand(5, d, generator=torch.Generator().manual_seed(0))
    present = torch.tensor([True, True, False, True, True])
    cid = 3
    answer, state = fit(rt, cid, body | {MEANS: protos, PRESENT: present})

    # the same steps by hand, on the task's random stream
    load_weights(rt.workspace.model("check"), body | {k: init[k] for k in model.head_keys()})
    ctx = ClientContext(cid, 1, derive_seed(config.seed, 1, 0, cid), rt.views.at(1)[cid], rt.workspace, rt.options)
    model = ctx.load(body | {k: init[k] for k in model.head_keys()})
    head_stats = train_only(ctx, model.head, model.body, 1)
    assert head_stats.samples == len(rt.views.at(1)[cid].train)  # one epoch on the head
    assert_same(ctx.weights(keys=model.body_keys()), body)  # body frozen meanwhile
    head = ctx.weights(keys=model.head_keys())
    target = (protos, present)
    if missing == "local":  # class 2 is aligned to the client's own prototype under the received body
        own = class_statistics(rt.workspace.model("check"), rt.workspace.dataset, rt.views.at(1)[cid].train, 5)
        assert own.present[2]  # the premise: this client holds class 2
        target = (torch.where(present.unsqueeze(1), protos, own.means), present | own.present)
    body_stats = train_body(ctx, model, alignment_loss(*target, 1.0, "mse"))
    assert body_stats.samples == 2 * len(rt.views.at(1)[cid].train)  # then the run's E epochs on the body
    assert_same(ctx.weights(keys=model.head_keys()), head)  # head frozen meanwhile
    assert all(p.requires_grad for p in model.parameters())

    assert_same({k: answer.tensors[k] for k in model.head_keys()}, head)
    assert_same({k: answer.tensors[k] for k in model.body_keys()}, ctx.weights(keys=model.body_keys()))
    assert_same(state["head"], head)
    assert answer.metrics["num_samples"] == 3 * len(rt.views.at(1)[cid].train)
    assert not torch.equal(head["head.weight"], init["head.weight"])


def test_client_uploads_statistics_of_the_received_body():
    rt = runtime(tiny_config(algorithm="fedpac"))
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    body = {k: init[k] for k in model.body_keys()}
    cid = 0
    answer, _ = fit(rt, cid, body)
    labels = rt.workspace.dataset.train.y[rt.views.at(1)[cid].train]
    assert torch.equal(answer.tensors[COUNTS], torch.bincount(labels, minlength=5))
    # V and h come from the received (initial) body, the prototypes from the trained one
    ctx = ClientContext(cid, 1, 0, rt.views.at(1)[cid], rt.workspace, rt.options)
    ctx.load(init)
    stats = ClassStats.zeros(5, model.feature_dim, "cpu")
    x, y = rt.workspace.dataset.batch(rt.workspace.dataset.train, rt.views.at(1)[cid].train)
    with torch.no_grad():
        stats.add(ctx.model().features(x), y)
    v, h = collaboration_statistics(stats)
    assert float(answer.tensors[VARIANCE]) == pytest.approx(float(v), rel=1e-6)
    assert torch.allclose(answer.tensors[PRIOR_PROTOS], h.float(), atol=1e-6)
    assert not torch.allclose(answer.tensors[MEANS], stats.means, atol=1e-4)


# --- the server ----------------------------------------------------------------------------------


# class 0 held by clients 1 (1 sample, prototype 1.0) and 2 (3 samples, prototype 2.0)
@pytest.mark.parametrize("aggregation, class0", [("weighted", (1 * 1 + 2 * 3) / 4), ("uniform", (1 + 2) / 2)])
def test_server_aggregates_and_sends_each_participant_its_combined_head(aggregation, class0):
    sim = simulation(tiny_config(algorithm="fedpac", options={"aggregation": aggregation}))
    server = sim.server
    model = sim.workspace.model()
    init = sim.server_ctx.init_weights
    d = model.feature_dim
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(5, d, generator=g), torch.rand(5, d, generator=g)
    h = {1: a, 2: a.clone(), 4: b}
    sizes = {1: 10, 2: 20, 4: 30}
    protos = {c: torch.full((5, d), float(c)) for c in h}
    counts = {1: torch.tensor([1, 0, 0, 0, 0]), 2: torch.tensor([3, 0, 0, 0, 0]), 4: torch.tensor([0, 0, 0, 5, 0])}
    replies = {
        c: reply(
            filled(init, float(c))
            | {MEANS: protos[c], COUNTS: counts[c], VARIANCE: torch.tensor(0.01).double(), PRIOR_PROTOS: h[c]},
            sizes[c],
        )
        for c in h
    }
    comm = ScriptedComm(replies)
    server.run_round(1, [1, 2, 4], comm)
    body_value = (1 * 10 + 2 * 20 + 4 * 30) / 60
    assert all(torch.allclose(v, torch.full_like(v, body_value)) for v in server.body.values())
    assert set(server.body) == set(model.body_keys())
    server_body = dict(server.body)
    assert torch.allclose(server.protos[0], torch.full((d,), class0))
    assert torch.allclose(server.protos[3], torch.full((d,), 4.0))
    assert server.present.tolist() == [True, False, False, True, False]

    # the last exchange: each participant's head Σ_j α_kj w_j, with α from the QP
    assert set(comm.sent) == {1, 2, 4} and all(m.kind == "set_head" for m in comm.sent.values())
    weights = np.array(comm.logged["fedpac_alpha"]["weights"])
    assert comm.logged["fedpac_alpha"]["clients"] == [1, 2, 4]
    for row, cid in enumerate([1, 2, 4]):
        head = comm.sent[cid].tensors
        assert set(head) == set(model.head_keys())
        expected = float(weights[row] @ np.array([1.0, 2.0, 4.0]))
        assert torch.allclose(head["head.weight"], torch.full_like(head["head.weight"], expected), atol=1e-3)
    assert weights[0, 1] > weights[0, 2] and weights[1, 0] > weights[1, 2]  # identical statistics

    # the next round sends the global body and prototypes
    again = HistoryComm(replies)
    server.run_round(2, [2, 4], again)
    (kind, sent), _ = again.calls
    assert kind == "fit" and set(sent) == {2, 4}
    out = sent[2].tensors
    assert_same({k: out[k] for k in model.body_keys()}, {k: v for k, v in server_body.items()})
    assert torch.equal(out[PRESENT], torch.tensor([True, False, False, True, False]))
    assert torch.allclose(out[MEANS][0], torch.full((d,), class0))


def test_participants_get_their_combined_heads_and_the_others_keep_theirs():
    sim = simulation(tiny_config(algorithm="fedpac", rounds=2))
    client = sim.executor.runtime.client  # serial: the client half runs here; record its uploads
    trained, fit_once = {}, client.fit

    def recording_fit(msg, ctx):
        answer = fit_once(msg, ctx)
        trained[ctx.cid] = {k: v for k, v in answer.tensors.items() if k.startswith("head.")}
        return answer

    client.fit = recording_fit
    try:
        sim.run_round(1)
        first = {c: dict(s["head"]) for c, s in sim.client_state.items()}
        sim.run_round(2)
    finally:
        sim.executor.close()
    round1, round2 = (set(log["clients"]) for log in sim.round_logs)
    assert set(first) == round1 and round1 - round2 and round2 - round1  # the premise
    for cid in round1 - round2:
        assert_same(sim.client_state[cid]["head"], first[cid])
    log = sim.round_logs[-1]["fedpac_alpha"]
    assert log["clients"] == sorted(round2)
    assert any(max(row) < 1 for row in log["weights"])  # some head mixes peers (else the check below is idle)
    for row, cid in zip(log["weights"], log["clients"]):
        assert abs(sum(row) - 1) < 1e-3
        head = sim.client_state[cid]["head"]
        for key, value in head.items():
            mix = sum(a * trained[j][key] for a, j in zip(row, log["clients"]))
            assert torch.allclose(value, mix, atol=1e-4), (cid, key)
        if max(row) < 1:  # mixed with a peer: not the head it trained
            assert not torch.equal(head["head.weight"], trained[cid]["head.weight"])


# --- options and runs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fedpac.lam=-1", "--set fedpac.lam"),
        ("fedpac.head_epochs=0", "--set fedpac.head_epochs"),
        ("fedpac.statistics=local", "--set fedpac.statistics"),
        ("fedpac.min_weight=1", "--set fedpac.min_weight"),
        ("fedpac.alignment=cos", "--set fedpac.alignment"),
        ("fedpac.missing_prototype=zero", "--set fedpac.missing_prototype"),
        ("fedpac.mu=1", "unknown key"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("fedpac", [assignment], needle)


def test_cli_run(tmp_path):
    result = run_cli(tmp_path, "fedpac", "fedpac.statistics=trained")
    assert 0.2 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    assert all(len(log["fedpac_alpha"]["weights"]) == 3 for log in result.logs)


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedpac"))
