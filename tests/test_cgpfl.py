"""CGPFL: personal models pulled to clustered generalized models; only those models are uploaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.cgpfl import kmeans_labels, match_to_centers
from fedtail.components import build_config
from fedtail.components import algorithm_options
from helpers import (
    ScriptedComm,
    assert_config_error,
    distance,
    evaluate,
    fit,
    planted_groups,
    reply,
    run_cli,
    runtime,
    same_partition,
    set_options,
    simulation,
)


def scripted(uploads: dict[int, dict], sizes: dict[int, int]) -> ScriptedComm:
    """A channel where client c uploads ``uploads[c]``, weighted by ``sizes[c]`` samples."""
    return ScriptedComm({c: reply(uploads[c], sizes[c]) for c in uploads})


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("cgpfl.num_clusters=0", "--set cgpfl.num_clusters: Input should be greater than or equal to 1"),
        ("cgpfl.mu=0", "--set cgpfl.mu: Input should be greater than 0"),
        ("cgpfl.inner_steps=0", "--set cgpfl.inner_steps"),
        ("cgpfl.eta=-0.1", "--set cgpfl.eta"),
        ("cgpfl.personal_lr=0", "--set cgpfl.personal_lr"),
        ("cgpfl.beta=0", "--set cgpfl.beta"),
        ("cgpfl.beta=2.5", "--set cgpfl.beta: Input should be less than or equal to 2"),
        ("cgpfl.recluster_every=0", "--set cgpfl.recluster_every"),
        ("cgpfl.weighting=median", "--set cgpfl.weighting"),
        ("cgpfl.lam=1", "unknown key"),
    ],
)
def test_bad_options_are_rejected_before_the_run(assignment, needle):
    assert_config_error("cgpfl", [assignment], needle)


def test_options_parse_and_default():
    # a new run gets pFedMe's restart of θ_i every round (the reference); the option's default is warm
    assert not algorithm_options(build_config(tiny_raw(algorithm="cgpfl"))).warm_start
    opts = algorithm_options(build_config(tiny_raw(algorithm="cgpfl"), reference=False))
    assert (opts.num_clusters, opts.mu, opts.inner_steps, opts.beta, opts.recluster_every) == (3, 15.0, 5, 1.0, 1)
    assert opts.eta is None and opts.personal_lr is None and opts.weighting == "uniform" and opts.warm_start
    assert opts.first_start == "received"
    opts = algorithm_options(build_config(tiny_raw(algorithm="cgpfl"), ["cgpfl.num_clusters=5", "algo.weighting=samples"]))
    assert opts.num_clusters == 5 and opts.weighting == "samples"


# --- client: the bi-level local update ---------------------------------------------------------


def test_larger_mu_keeps_the_personal_model_closer_to_the_cluster_model():
    config = tiny_config(algorithm="cgpfl")
    rt = runtime(config)
    cluster_model = rt.workspace.init_weights
    drift = {}
    for mu in (0.1, 15.0):  # personal lr 0.05 · μ 15 = 0.75: a strong but stable pull
        set_options(rt, config, mu=mu)
        _, state = fit(rt, 2, cluster_model)
        drift[mu] = distance(state["personal"], cluster_model)
    assert 0 < drift[15.0] < 0.5 * drift[0.1]


def test_upload_is_the_pulled_local_generalized_model_never_the_personal_one():
    # One local round (--local-steps 1): ω_1 = ω_0 − η·μ·(ω_0 − θ_1) exactly.
    config = tiny_config(algorithm="cgpfl", train={"local_steps": 1}, options={"mu": 2.0, "eta": 0.1})
    rt = runtime(config)
    received = {k: v + 0.01 for k, v in rt.workspace.init_weights.items()}
    reply, state = fit(rt, 1, received)
    personal = state["personal"]
    assert reply.tensors.keys() == personal.keys() == received.keys()
    for k in received:
        expected = received[k] - 0.1 * 2.0 * (received[k] - personal[k])
        assert torch.allclose(reply.tensors[k], expected, atol=1e-7), k
        assert not torch.equal(reply.tensors[k], personal[k]), k
        assert not torch.equal(reply.tensors[k], received[k]), k
    assert reply.metrics["num_steps"] == 5  # one batch, inner_steps SGD steps on it


def test_personal_model_persists_and_warm_start_decides_where_the_inner_solve_starts():
    config = tiny_config(algorithm="cgpfl", options={"warm_start": True})
    rt = runtime(config)
    w = rt.workspace.init_weights
    stored = {k: v + 0.2 for k, v in w.items()}
    fresh, fresh_state = fit(rt, 3, w)
    warm, warm_state = fit(rt, 3, w, {"personal": stored})
    assert distance(warm_state["personal"], fresh_state["personal"]) > 1e-3
    set_options(rt, config, warm_start=False)  # the same task restarts from the received model
    cold, cold_state = fit(rt, 3, w, {"personal": stored})
    assert all(torch.equal(cold_state["personal"][k], fresh_state["personal"][k]) for k in w)
    assert all(torch.equal(cold.tensors[k], fresh.tensors[k]) for k in w)


def test_first_start_init_trains_a_new_client_from_the_initial_model_whatever_it_is_sent():
    # μ ≈ 0: θ_i's training no longer feels ω_i, so where θ_i starts decides where it ends
    config = tiny_config(algorithm="cgpfl", options={"mu": 1e-9})
    rt = runtime(config)
    init = rt.workspace.init_weights
    sent = {k: v + 0.2 if v.is_floating_point() else v for k, v in init.items()}
    _, sent_state = fit(rt, 2, sent)  # the default, first_start=received
    from_init_default, init_state = fit(rt, 2, init)
    set_options(rt, config, mu=1e-9, first_start="init")
    from_init, state = fit(rt, 2, sent)
    # θ_i trains from the initial model: the personal model as if the initial model were sent
    assert distance(state["personal"], init_state["personal"]) < 1e-5
    assert distance(state["personal"], sent_state["personal"]) > 1e-2
    # the upload ω_i is still the received model (pulled by η·μ ≈ 0), not the initial one
    assert distance(from_init.tensors, sent) < 1e-5 < distance(from_init.tensors, from_init_default.tensors)
    # a client with a stored θ_i is unaffected
    stored = {k: v + 0.1 if v.is_floating_point() else v for k, v in init.items()}
    _, kept = fit(rt, 2, sent, {"personal": stored})
    set_options(rt, config, mu=1e-9, first_start="received")
    _, kept_default = fit(rt, 2, sent, {"personal": stored})
    assert all(torch.equal(kept["personal"][k], kept_default["personal"][k]) for k in init)


@pytest.mark.parametrize("first_start", ["received", "init"])
def test_a_client_never_sampled_is_evaluated_with_its_first_start(first_start):
    server = server_for(num_clusters=2, first_start=first_start)
    init = server.ctx.init_weights
    uploads = uploads_around(init, {0: 1.0, 3: -1.0})
    server.run_round(1, [0, 3], scripted(uploads, {0: 1, 3: 1}))
    key = "head.bias"
    mean = 0.5 * (server.centers[0][key] + server.centers[1][key])
    expected, other = (init[key], mean) if first_start == "init" else (mean, init[key])
    sent = server.evaluation_message(2).tensors[key]
    assert torch.allclose(sent, expected, atol=1e-6) and not torch.allclose(sent, other, atol=1e-3)
    # a client that uploaded is sent its cluster's model either way
    assert torch.equal(server.evaluation_message(0).tensors[key], server.centers[server.assignment[0]][key])


def test_first_start_init_without_warm_start_is_rejected():
    assert_config_error("cgpfl", ["cgpfl.first_start=init", "cgpfl.warm_start=false"], "needs warm_start")
    # the reference's warm_start=false does not hide the fix from a user who set only first_start
    assert_config_error("cgpfl", ["cgpfl.first_start=init"], "set cgpfl.warm_start=true with it")
    algorithm_options(build_config(tiny_raw(algorithm="cgpfl"), ["cgpfl.first_start=init", "cgpfl.warm_start=true"]))


def test_evaluation_uses_the_personal_model_if_any_else_the_message():
    rt = runtime(tiny_config(algorithm="cgpfl"))
    w = rt.workspace.init_weights
    g = torch.Generator().manual_seed(0)
    personal = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    with_personal = evaluate(rt, 3, w, {"personal": personal})
    as_message = evaluate(rt, 3, personal, {})
    plain = evaluate(rt, 3, w, {})
    assert torch.equal(with_personal.tensors["correct"], as_message.tensors["correct"])
    assert not torch.equal(with_personal.tensors["correct"], plain.tensors["correct"])


# --- server: clustering and aggregation -------------------------------------------------------


def planted(sizes=(5, 4, 6), dim=40, seed=0) -> tuple[torch.Tensor, np.ndarray]:
    """Points around well-separated random centres, rows shuffled; and their true groups."""
    return planted_groups(sizes, dim, scale=10.0, spread=0.1, shuffle=True, seed=seed)


def test_kmeans_recovers_planted_clusters_and_is_seeded():
    points, truth = planted()
    labels = kmeans_labels(points, 3, seed=2**40 + 7)  # a 63-bit run seed is folded into sklearn's range
    assert same_partition(labels, truth)
    assert np.array_equal(kmeans_labels(points, 3, seed=5), kmeans_labels(points, 3, seed=5))


def test_clusters_continue_the_nearest_generalized_models():
    means = torch.tensor([[0.0, 9.0], [10.0, 0.0], [0.0, 0.0]])
    centers = torch.tensor([[0.1, 0.0], [0.0, 10.0], [9.0, 0.0]])
    assert match_to_centers(means, centers).tolist() == [1, 2, 0]
    # fewer clusters than generalized models: each still gets a distinct one
    assert match_to_centers(means[:2], centers).tolist() == [1, 2]


def server_for(**options):
    options = {"warm_start": True} | options  # first_start="init" needs it
    return simulation(tiny_config(algorithm="cgpfl", options=options, log_clustering_every=1)).server


def uploads_around(init: dict, offsets: dict[int, float]) -> dict[int, dict]:
    g = torch.Generator().manual_seed(1)
    out = {}
    for cid, off in offsets.items():
        out[cid] = {
            k: v + off + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in init.items()
        }
    return out


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_one_cluster_with_beta_one_is_the_mean_of_the_uploads(weighting):
    server = server_for(num_clusters=1, beta=1.0, weighting=weighting)
    init = server.ctx.init_weights
    uploads = uploads_around(init, {0: 0.5, 2: -0.3, 5: 1.0})
    sizes = {0: 10, 2: 30, 5: 60}
    comm = scripted(uploads, sizes)
    server.run_round(1, [0, 2, 5], comm)
    w = {c: (1.0 if weighting == "uniform" else sizes[c]) for c in sizes}
    for k, v in init.items():
        expected = sum(w[c] * uploads[c][k].double() for c in sizes) / sum(w.values())
        assert torch.allclose(server.centers[0][k].double(), expected, atol=1e-6), k
    assert all(torch.equal(comm.sent[c].tensors[k], init[k]) for c in sizes for k in init)
    rec = comm.logged["clustering"]
    assert rec["clients"] == [0, 2, 5] and rec["clusters"] == [0, 0, 0] and rec["num_clusters"] == 1
    assert len(rec["round_pca"]) == 3
    # β < 1 moves the generalized model only part of the way: ω ← (1 − β)·ω + β·mean
    half = server_for(num_clusters=1, beta=0.5, weighting=weighting)
    half.run_round(1, [0, 2, 5], scripted(uploads, sizes))
    key = "head.weight"
    assert torch.allclose(half.centers[0][key], 0.5 * init[key] + 0.5 * server.centers[0][key], atol=1e-6)


def test_each_client_trains_from_its_cluster_model_and_newcomers_get_the_membership_mean():
    server = server_for(num_clusters=2)
    init = server.ctx.init_weights
    uploads = uploads_around(init, {0: 1.0, 1: 1.0, 3: -1.0, 4: 1.0})
    server.run_round(1, [0, 1, 3, 4], scripted(uploads, {c: 1 for c in uploads}))
    a, b = server.assignment[0], server.assignment[3]
    assert a != b and server.assignment[1] == server.assignment[4] == a
    key = "head.bias"
    expected_a = (uploads[0][key] + uploads[1][key] + uploads[4][key]) / 3
    assert torch.allclose(server.centers[a][key], expected_a, atol=1e-6)
    assert torch.allclose(server.centers[b][key], uploads[3][key])
    # next round: each sampled client receives its own cluster's model; client 2 (never sampled)
    # and every evaluation of it get the generalized models weighted by membership (3 : 1)
    comm = scripted(uploads_around(init, {0: 1.0, 2: 0.0, 3: -1.0}), {0: 1, 2: 1, 3: 1})
    newcomer = 0.75 * server.centers[a][key] + 0.25 * server.centers[b][key]
    assert torch.allclose(server.evaluation_message(2).tensors[key], newcomer, atol=1e-6)
    server.run_round(2, [0, 2, 3], comm)
    assert comm.sent[0].tensors is not comm.sent[3].tensors
    assert torch.allclose(comm.sent[0].tensors[key], expected_a, atol=1e-6)
    assert torch.allclose(comm.sent[2].tensors[key], newcomer, atol=1e-6)


def test_between_reclusterings_clients_keep_their_cluster_and_newcomers_join_the_nearest():
    server = server_for(num_clusters=2, recluster_every=5)
    init = server.ctx.init_weights
    server.run_round(1, [0, 3], scripted(uploads_around(init, {0: 1.0, 3: -1.0}), {0: 1, 3: 1}))
    a, b = server.assignment[0], server.assignment[3]
    # round 2 is no k-means round: client 0 now uploads near cluster b but stays in a;
    # newcomer 5 uploads near a's model and joins a
    comm = scripted(uploads_around(init, {0: -1.0, 5: 1.0}), {0: 1, 5: 1})
    server.run_round(2, [0, 5], comm)
    assert server.assignment == {0: a, 3: b, 5: a}
    assert comm.logged["clustering"]["reclustered"] is False
    assert comm.logged["clustering"]["clients"] == [0, 3, 5]


# --- end to end ---------------------------------------------------------------------------------

def test_runs_end_to_end_above_chance(tmp_path):
    result = run_cli(tmp_path, "cgpfl", "cgpfl.num_clusters=2", flags=["--log-clustering-every", "1"])
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    logs = result.logs
    assert [len(r["clustering"]["clusters"]) for r in logs] == [3, len({*logs[0]["clients"], *logs[1]["clients"]})]
    assert all(r["clustering"]["num_clusters"] <= 2 for r in logs)
