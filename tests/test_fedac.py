"""FedAC's mechanisms (LrCos E-step, M-step, CNT, the two pulls), FedPer, and --local-steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.fedac import (
    fit_map,
    granularity,
    initial_labels,
    e_step,
    m_step,
    regularizer,
    tune_clusters,
)
from fedtail.algorithms.clustering import centred_gram, cosine_matrix, squared_distances
from fedtail.components import build_config
from fedtail.engine.context import ClientContext
from fedtail.errors import ConfigError
from helpers import (
    CLUSTERED_SMOKE,
    ScriptedComm,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    fit,
    planted_groups,
    reply,
    run,
    run_cli,
    runtime,
    same_partition,
    set_options,
    simulation,
    strip_timing,
)


def planted(groups: int, per_group: int, dim: int = 40, spread: float = 0.05, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """Rows around ``groups`` random directions (with a common offset, as models share one)."""
    return planted_groups([per_group] * groups, dim, spread=spread, offset=5.0, seed=seed)


# --- the server's steps on hand-made vectors ---------------------------------------------------


def test_e_step_assigns_each_model_to_its_most_similar_centre():
    centres = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    rows = torch.tensor([[3.0, 0.2], [0.1, 0.9], [-0.5, -0.7], [2.0, 1.5]])
    assert e_step(rows, centres, "lrcos", None, True).tolist() == [0, 1, 2, 0]
    assert e_step(rows, centres, "l2", None, True).tolist() == [0, 1, 2, 0]


def test_lrcos_differs_from_l2_when_norms_differ():
    centres = torch.tensor([[1.0, 0.0], [4.0, 4.0]])
    row = torch.tensor([[4.0, 1.5]])  # cosine 0.94 with centre 0 vs 0.91; squared L2 11.25 vs 6.25
    assert e_step(row, centres, "lrcos", None, True).tolist() == [0]
    assert e_step(row, centres, "l2", None, True).tolist() == [1]


def test_pca_map_recovers_planted_clusters_despite_a_shared_offset():
    rows, truth = planted(3, 6)
    pca = fit_map(rows, dims=50, seed=0)
    assert len(pca["components"]) == len(rows) - 1  # D capped by the number of models
    labels = initial_labels(rows, 3, pca, center=True, seed=0)
    assert same_partition(labels, truth)
    # Uncentred, every model is dominated by the shared offset: all cosines are close to 1.
    centres, _ = m_step(rows, truth, None)
    from fedtail.algorithms.fedac import reduce
    from fedtail.algorithms.clustering import cosine_matrix

    uncentred = cosine_matrix(reduce(pca, rows, False), reduce(pca, centres, False))
    centred = cosine_matrix(reduce(pca, rows, True), reduce(pca, centres, True))
    assert uncentred.min() > 0.8 and centred.min() < 0.0


def test_m_step_is_the_plain_or_weighted_member_mean_and_drops_empty_clusters():
    rows = torch.tensor([[0.0, 0.0], [2.0, 2.0], [10.0, 0.0]])
    centres, labels = m_step(rows, np.array([3, 3, 7]), None)  # labels 0..2 unused: dropped
    assert labels.tolist() == [0, 0, 1]
    assert torch.allclose(centres, torch.tensor([[1.0, 1.0], [10.0, 0.0]]))
    weighted, _ = m_step(rows, np.array([0, 0, 1]), np.array([3.0, 1.0, 5.0]))
    assert torch.allclose(weighted[0], torch.tensor([0.5, 0.5]))


def test_granularity_is_intra_over_inter():
    rows = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 2.0], [20.0, 0.0]])
    labels = np.array([0, 0, 1, 1, 2])
    centres, labels = m_step(rows, labels, None)
    gc = granularity(centred_gram(rows), labels)
    # cluster 0: centre (1,0), intra 1; inter: ‖(1,0)−(10,1)‖² = 82, ‖(1,0)−(20,0)‖² = 361 → 221.5
    assert gc[0] == pytest.approx(1 / 221.5)
    assert gc[2] == pytest.approx(0.0, abs=1e-12)  # a singleton has no spread
    assert np.isnan(granularity(centred_gram(rows), np.zeros(5, dtype=int))).all()


def test_cnt_merges_a_tight_cluster_into_its_nearest_and_splits_a_wide_one():
    # Cluster 0 mixes two groups 120 apart (wide); cluster 1 is one point 5 from cluster 2.
    a, _ = planted(1, 4, dim=2, spread=0.1, seed=1)
    a = a - a.mean(0)
    up, down, single = torch.tensor([0.0, 60.0]), torch.tensor([0.0, -60.0]), torch.tensor([[60.0, 0.0]])
    rows = torch.cat([a + up, a + down, single, torch.tensor([[65.0, 0.0], [66.0, 0.0]])])
    labels = np.array([0] * 8 + [1] + [2, 2])
    centres, labels = m_step(rows, labels, None)
    gram = centred_gram(rows)
    gc = granularity(gram, labels)
    assert gc[0] > 0.8 and gc[1] < 0.2
    new, info = tune_clusters(gram, labels, None, a=0.2, b=0.8, max_clusters=10, seed=0)
    assert info["merged"] == [[1, 2]] or info["merged"] == [(1, 2)]
    assert info["split"] == [0]
    assert new[8] == new[9] == new[10]  # the singleton joined its nearest cluster
    assert len(set(new[:4].tolist())) == 1 and len(set(new[4:8].tolist())) == 1 and new[0] != new[4]
    # max_clusters stops the split.
    capped, info = tune_clusters(gram, labels, None, a=0.2, b=0.8, max_clusters=2, seed=0)
    assert info["split"] == [] and len(set(capped.tolist())) == 2


def test_cnt_leaves_clusters_alone_inside_the_band():
    rows, truth = planted(3, 5, dim=8, spread=0.3)
    _, labels = m_step(rows, truth, None)
    new, info = tune_clusters(centred_gram(rows), labels, None, a=1e-9, b=1e9, max_clusters=10, seed=0)
    assert new.tolist() == labels.tolist() and not info["merged"] and not info["split"]


def _reference_fedac_steps(rows, labels, centres, dims, weights=None):
    """FedAC's server steps as they were before issue 21: sklearn's full-SVD PCA and d-dimensional distances."""
    from sklearn.decomposition import PCA

    x = rows.double().numpy()
    pca = PCA(n_components=min(dims, len(x) - 1), svd_solver="full").fit(x)
    reduce = lambda r: (r.double().numpy() - pca.mean_) @ pca.components_.T  # noqa: E731
    cos = cosine_matrix(torch.from_numpy(reduce(rows)), torch.from_numpy(reduce(centres)))
    means, labels = m_step(rows, labels, weights)
    k = len(means)
    to_centre = squared_distances(rows, means).numpy()
    between = squared_distances(means, means).numpy()
    gc = [to_centre[labels == c, c].mean() / (between[c].sum() / (k - 1)) for c in range(k)]
    return pca, reduce(rows), cos.argmax(1).numpy(), np.array(gc)


@pytest.mark.parametrize("weighted", [False, True])
def test_gram_pca_and_cnt_equal_the_d_dimensional_computation(weighted):
    """Issue 21: the Gram route gives sklearn's PCA scores (up to each axis' sign), the same E-step and G_c."""
    rows, truth = planted(4, 8, dim=2000, spread=0.3, seed=3)
    centres = m_step(rows + 0.01, truth, None)[0]  # last round's centres: not in the rows' span
    weights = np.arange(1.0, len(rows) + 1) if weighted else None
    pca, scores, assignment, gc = _reference_fedac_steps(rows, truth, centres, dims=10, weights=weights)
    gram = centred_gram(rows)
    mine = fit_map(rows, 10, 0, gram)
    from fedtail.algorithms.fedac import reduce

    ours = reduce(mine, rows, True).numpy()
    assert ours.shape == scores.shape
    for axis in range(scores.shape[1]):
        sign = np.sign(ours[:, axis] @ scores[:, axis])
        np.testing.assert_allclose(ours[:, axis], sign * scores[:, axis], atol=1e-4 * np.abs(scores).max())
    assert np.array_equal(e_step(rows, centres, "lrcos", mine, True), assignment)
    assert same_partition(assignment, truth)
    np.testing.assert_allclose(granularity(gram, truth, weights), gc, rtol=1e-4)


def test_initial_labels_on_the_gram_pca_equal_sklearns():
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    rows, truth = planted(3, 7, dim=1500, spread=0.4, seed=5)
    pca, scores, _, _ = _reference_fedac_steps(rows, truth, rows[:3], dims=50)
    unit = scores / np.linalg.norm(scores, axis=1, keepdims=True)
    reference = KMeans(n_clusters=3, n_init=10, random_state=11).fit_predict(unit)
    labels = initial_labels(rows, 3, fit_map(rows, 50), center=True, seed=11)
    assert adjusted_rand_score(reference, labels) == pytest.approx(1.0)


def test_fedac_server_keeps_models_in_one_growing_float32_matrix():
    config = tiny_config(algorithm="fedac", partition={"num_clients": 6}, fraction=1.0, rounds=1)
    sim = simulation(config)
    sim.run()
    server = sim.server
    assert server.models.dtype == torch.float32 and server.models.shape[0] == len(server.known) == 6
    state = server.state_dict()
    assert state["models"].shape[0] == 6  # no spare rows in a checkpoint
    server.load_state_dict(state)
    assert server._index == {cid: i for i, cid in enumerate(server.known)}


# --- the client -------------------------------------------------------------------------------


def test_regularizer_is_both_pulls_and_the_head_feels_only_mu():
    config = tiny_config(algorithm="fedac")
    rt = runtime(config)
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    model.load_state_dict(init)
    anchor = {k: v + 1.0 for k, v in init.items()}
    phi = {k: init[k] - 2.0 for k in model.body_keys()}
    term = regularizer(model, anchor, phi, mu=0.3, lam=0.5)
    value = term(model, None, None, None)
    n_all = sum(p.numel() for p in model.parameters())
    n_body = sum(p.numel() for p in model.body.parameters())
    assert float(value.detach()) == pytest.approx(0.5 * 0.3 * n_all + 0.5 * 0.5 * 4 * n_body, rel=1e-5)
    value.backward()
    head_w = model.head.weight.grad
    assert torch.allclose(head_w, torch.full_like(head_w, -0.3))  # μ·(ω − Ω) = −0.3
    body_w = next(model.body.parameters()).grad
    assert torch.allclose(body_w, torch.full_like(body_w, -0.3 + 0.5 * 2))  # + λ·(φ − Φ) = +1


def test_client_keeps_its_personal_model_and_a_strong_mu_holds_it_at_the_centre():
    rt = runtime(tiny_config(algorithm="fedac", options={"mu": 0.0, "lam": 0.0}))
    init = rt.workspace.init_weights
    model = rt.workspace.model()
    phi = {"global/" + k: init[k] for k in model.body_keys()}
    reply, state = fit(rt, 2, init | phi)
    assert_same(reply.tensors, state["personal"])
    assert set(reply.tensors) == set(init)  # the whole model, no Φ echoed back
    # Next round, training resumes from the personal model, not from the message's centre.
    centre = {k: v + 0.5 for k, v in init.items()}
    again, state2 = fit(rt, 2, centre | phi, state)
    free = sum(float((again.tensors[k] - state["personal"][k]).abs().sum()) for k in init)
    to_centre = sum(float((again.tensors[k] - centre[k]).abs().sum()) for k in init)
    assert free < to_centre
    strong = runtime(tiny_config(algorithm="fedac", options={"mu": 50.0, "lam": 0.0}, train={"lr": 0.01}))
    pulled, _ = fit(strong, 2, centre | phi, state)
    assert sum(float((pulled.tensors[k] - centre[k]).abs().sum()) for k in init) < to_centre


def test_first_start_init_trains_a_new_client_from_the_initial_model_whatever_it_is_sent():
    # μ = λ = 0: the model in the message could only matter as the starting point.
    config = tiny_config(algorithm="fedac", options={"mu": 0.0, "lam": 0.0})
    rt = runtime(config)
    init = rt.workspace.init_weights
    phi = {"global/" + k: init[k] for k in rt.workspace.model().body_keys()}
    mean = {k: v + 0.5 for k, v in init.items()}  # stands for the mean of the uploaded models
    from_init, state = fit(rt, 2, mean | phi)  # the default, first_start=init
    reference, _ = fit(rt, 2, init | phi)
    assert_same(from_init.tensors, reference.tensors)
    set_options(rt, config, mu=0.0, lam=0.0, first_start="uploaded-mean")
    from_mean, _ = fit(rt, 2, mean | phi)
    assert distance(from_mean.tensors, mean) < distance(from_mean.tensors, init)
    assert distance(from_mean.tensors, reference.tensors) > 1.0
    # Once a client has its own model, both continue from it.
    later_mean, _ = fit(rt, 2, mean | phi, dict(state))  # fit writes into the state it is given
    set_options(rt, config, mu=0.0, lam=0.0, first_start="init")
    later_init, _ = fit(rt, 2, mean | phi, dict(state))
    assert_same(later_mean.tensors, later_init.tensors)


@pytest.mark.parametrize("first_start", ["init", "uploaded-mean"])
def test_a_client_that_has_not_uploaded_is_evaluated_with_its_first_start(first_start):
    sim = simulation(tiny_config(algorithm="fedac", options={"first_start": first_start}))
    server, init = sim.server, sim.server_ctx.init_weights
    uploads = {0: {k: v + 1.0 for k, v in init.items()}, 1: {k: v + 3.0 for k, v in init.items()}}
    server.run_round(1, [0, 1], ScriptedComm({cid: reply(t, 10) for cid, t in uploads.items()}))
    mean = {k: v + 2.0 for k, v in init.items()}
    expected = init if first_start == "init" else mean
    sent = server.evaluation_message(4).tensors
    assert distance(sent, expected) < 1e-4 < distance(sent, mean if first_start == "init" else init)
    assert server.evaluation_message(0).tensors == {}  # it keeps its personal model
    # The pull of a client not assigned yet is the mean of the uploads under either option.
    comm = ScriptedComm({4: reply(mean, 10)})
    server.run_round(2, [4], comm)
    anchor = {k: v for k, v in comm.sent[4].tensors.items() if not k.startswith("global/")}
    assert distance(anchor, mean) < 1e-4


def test_first_start_changes_a_run_and_bad_values_are_rejected():
    base = tiny_config(algorithm="fedac", rounds=3, options={"num_clusters": 2})
    default, _ = run(base)
    explicit, _ = run(base.model_copy(update={"options": {"num_clusters": 2, "first_start": "init"}}))
    mean, _ = run(base.model_copy(update={"options": {"num_clusters": 2, "first_start": "uploaded-mean"}}))
    assert strip_timing(default) == strip_timing(explicit)
    assert [r["per_client_acc"] for r in default] != [r["per_client_acc"] for r in mean]
    assert_config_error("fedac", ["fedac.first_start=mean"], "--set fedac.first_start")


# --- options and runs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fedac.gc_low=0.9", "gc_low (0.9) must be below gc_high (0.8)"),
        ("fedac.similarity=kl", "--set fedac.similarity"),
        ("fedac.num_clusters=0", "--set fedac.num_clusters"),
        ("fedac.num_clusters=30", "must not exceed max_clusters"),
        ("fedac.mu=-1", "--set fedac.mu"),
    ],
)
def test_bad_fedac_options_are_rejected(assignment, needle):
    assert_config_error("fedac", [assignment], needle)


@pytest.mark.parametrize("algorithm", ["fedac", "fedper"])
def test_runs_end_to_end_above_chance(tmp_path, algorithm):
    result = run_cli(tmp_path, algorithm, smoke=CLUSTERED_SMOKE, flags=["--local-steps", "5"])
    assert 1 / 4 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    if algorithm == "fedac":
        records = result.clustering
        assert len(records) == 3
        last = records[-1]
        assert len(last["clients"]) == len(last["clusters"]) == len(last["pca"])
        assert last["num_clusters"] == len(set(last["clusters"]))


def test_fedac_serial_and_parallel_agree_exactly():
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedac", rounds=3, options={"num_clusters": 2}))


def test_fedac_reaches_every_sampled_client_with_a_cluster():
    rows, sim = run(tiny_config(algorithm="fedac", rounds=4, options={"num_clusters": 2, "cnt": False}))
    sampled = {c for row in rows for r in row["rounds_log"] for c in r["clients"]}
    last = rows[-1]["rounds_log"][-1]["clustering"]
    assert set(last["clients"]) == sampled
    assert last["num_clusters"] <= 2
    assert {c for c, s in sim.client_state.items() if "personal" in s} == sampled


# --- FedPer -------------------------------------------------------------------------------------


def test_fedper_trains_body_and_head_together_and_uploads_only_the_body():
    rt = runtime(tiny_config(algorithm="fedper"))
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    body = {k: init[k] for k in model.body_keys()}
    reply, state = fit(rt, 1, body)
    assert set(reply.tensors) == set(model.body_keys())
    assert set(state["head"]) == set(model.head_keys())
    assert all(not torch.equal(reply.tensors[k], init[k]) for k in model.body_keys() if init[k].is_floating_point())
    assert all(not torch.equal(state["head"][k], init[k]) for k in model.head_keys())
    # A second round starts from the global body and the kept head, and trains the head further.
    first_head = state["head"]["head.weight"].clone()
    _, state2 = fit(rt, 1, body, state)
    assert not torch.equal(state2["head"]["head.weight"], first_head)


# --- --local-steps ------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 5, 23])
def test_local_steps_take_exactly_that_many_batches(steps):
    config = tiny_config(train={"local_steps": steps, "local_epochs": 3, "batch_size": 8})
    rt = runtime(config)
    ctx = ClientContext(0, 1, 7, rt.views.at(1)[0], rt.workspace, rt.options)
    ctx.load(rt.workspace.init_weights)
    stats = ctx.train()
    assert stats.steps == steps
    explicit = ctx.train(epochs=1)  # an algorithm's explicit epochs are not replaced
    assert explicit.steps == -(-ctx.data.num_train // 8)


def test_local_steps_flag_reaches_the_config():
    config = build_config(tiny_raw(), ["train.local_steps=5"])
    assert config.train.local_steps == 5
    with pytest.raises(ConfigError):
        build_config(tiny_raw(), ["train.local_steps=0"])
