"""FL+HC: agglomerative clustering of updates, FedAvg before it, cluster-only averaging, options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.aggregate import weighted_mean
from fedtail.algorithms.flhc import hierarchical_clusters
from fedtail.components import build_config
from fedtail.components import algorithm_options
from helpers import (
    CLUSTERED_SMOKE,
    PlantedUpdateComm,
    assert_config_error,
    assert_same,
    parity_deltas,
    planted_groups,
    planted_updates,
    run,
    run_cli,
    same_partition,
    simulation,
    strip_timing,
)

# --- the clustering on hand-made vectors -------------------------------------------------------


def offset_groups(seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """Three tight groups of updates around well separated points (similar lengths)."""
    return planted_groups([5, 5, 5], 20, scale=3.0, spread=0.1, seed=seed)


@pytest.mark.parametrize(
    "metric, linkage",
    [("euclidean", "ward"), ("euclidean", "single"), ("manhattan", "complete"), ("cosine", "average")],
)
def test_agglomerative_clustering_recovers_planted_groups(metric, linkage):
    rows, truth = offset_groups()
    labels = hierarchical_clusters(rows, metric, linkage, 3, None)
    assert same_partition(labels, truth)
    assert labels[0] == 0  # renumbered by first appearance


def test_distance_threshold_cuts_the_tree():
    rows, truth = offset_groups()
    within = torch.cdist(rows, rows)[truth[:, None] == truth[None, :]].max()
    between = torch.cdist(rows, rows)[truth[:, None] != truth[None, :]].min()
    threshold = float(within + between) / 2
    assert same_partition(hierarchical_clusters(rows, "euclidean", "single", None, threshold), truth)
    assert len(set(hierarchical_clusters(rows, "euclidean", "single", None, float(within) / 10))) > 3
    assert set(hierarchical_clusters(rows, "euclidean", "single", None, 1e6)) == {0}


def test_cosine_metric_groups_directions_that_euclidean_splits_by_length():
    rows, truth = planted_updates(groups=2, per_group=6)  # two directions, lengths 0.2 .. 5
    assert same_partition(hierarchical_clusters(rows, "cosine", "average", 2, None), truth)
    assert not same_partition(hierarchical_clusters(rows, "euclidean", "ward", 2, None), truth)


# --- the method --------------------------------------------------------------------------------


def test_before_clustering_flhc_is_exactly_fedavg():
    n = 2
    options = {"cluster_round": n, "num_clusters": 2}
    rows, flhc = run(tiny_config(algorithm="flhc", rounds=3, options=options, log_clustering_every=1))
    fed_rows, _ = run(tiny_config(algorithm="fedavg", rounds=3))
    _, fedavg_n = run(tiny_config(algorithm="fedavg", rounds=n))
    assert strip_timing(rows[: n - 1]) == strip_timing(fed_rows[: n - 1])
    assert_same(flhc.server.weights, fedavg_n.server.weights)  # w^n, where the clusters started
    # Round n: the clusters exist but still hold w^n, so every client's accuracy is FedAvg's.
    assert rows[n - 1]["personalized_acc"] == fed_rows[n - 1]["personalized_acc"]
    assert rows[n - 1]["global_acc"] is None and fed_rows[n - 1]["global_acc"] is not None
    assert "clustering" not in rows[0]["rounds_log"][0]
    assert rows[n - 1]["rounds_log"][-1]["clustering"]["clients"] == list(range(6))
    # afterwards the clusters train apart: the method is no longer FedAvg
    assert rows[n]["personalized_acc"] != pytest.approx(fed_rows[n]["personalized_acc"])


def test_all_clients_send_updates_and_cluster_models_average_only_their_members():
    options = {"cluster_round": 1, "num_clusters": 2, "metric": "cosine", "linkage": "average"}
    sim = simulation(tiny_config(algorithm="flhc", options=options, log_clustering_every=1))
    server = sim.server
    sizes = sim.server_ctx.client_train_sizes
    comm = PlantedUpdateComm(parity_deltas(sim), sizes)  # client c's update points along direction c % 2
    server.run_round(1, [1, 4], comm)
    assert comm.calls == [("fit", [1, 4]), ("fit", list(range(6)))]  # FedAvg, then everyone for the clustering
    w_n = weighted_mean((comm.history[0][c].tensors, float(sizes[c])) for c in (1, 4))  # the FedAvg round
    assert_same(server.weights, w_n)
    assert same_partition(server.labels, [c % 2 for c in range(6)])
    assert all(all(torch.equal(m[k], w_n[k]) for k in w_n) for m in server.clusters)  # both start from w^n
    assert comm.logged["clustering"]["clusters"] == server.labels

    server.run_round(2, [0, 2, 3], comm)
    even, odd = server.labels[0], server.labels[1]
    assert_same(server.clusters[even], weighted_mean((comm.replies[c].tensors, float(sizes[c])) for c in (0, 2)))
    assert_same(server.clusters[odd], comm.replies[3].tensors)
    server.run_round(3, [0, 2], comm)
    assert_same(server.clusters[odd], comm.replies[3].tensors)  # no member sampled: kept
    assert_same(server.evaluation_message(5).tensors, server.clusters[odd])
    assert server.global_weights() is None


def test_clients_evaluate_with_the_global_model_before_clustering():
    sim = simulation(tiny_config(algorithm="flhc", options={"cluster_round": 3}))
    assert_same(sim.server.evaluation_message(2).tensors, sim.server_ctx.init_weights)
    assert_same(sim.server.global_weights(), sim.server_ctx.init_weights)


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignments, needle",
    [
        (["flhc.metric=cosine"], "--set flhc.linkage: ward linkage works only with metric euclidean"),
        (["flhc.metric=manhattan", "flhc.linkage=ward"], "choose linkage average, complete or single"),
        (["flhc.num_clusters=null"], "give exactly one of num_clusters and distance_threshold"),
        (["flhc.num_clusters=3", "flhc.distance_threshold=0.5"], "give exactly one of"),
        (["flhc.distance_threshold=0"], "--set flhc.distance_threshold"),
        (["flhc.num_clusters=0"], "--set flhc.num_clusters"),
        (["flhc.cluster_round=0"], "--set flhc.cluster_round"),
        (["flhc.metric=l2", "flhc.linkage=single"], "--set flhc.metric"),
        (["flhc.linkage=centroid"], "--set flhc.linkage"),
    ],
)
def test_bad_flhc_options_are_rejected(assignments, needle):
    assert_config_error("flhc", assignments, needle)


def test_options_parse_and_default():
    opts = algorithm_options(build_config(tiny_raw(algorithm="flhc")))
    assert (opts.cluster_round, opts.metric, opts.linkage, opts.num_clusters, opts.distance_threshold) == (
        10, "euclidean", "ward", 5, None,
    )  # fmt: skip
    threshold = algorithm_options(build_config(tiny_raw(algorithm="flhc"), ["flhc.distance_threshold=2.5"]))
    assert threshold.num_clusters is None and threshold.distance_threshold == 2.5
    cosine = build_config(tiny_raw(algorithm="flhc"), ["flhc.metric=cosine", "flhc.linkage=average"])
    assert algorithm_options(cosine).metric == "cosine"


def test_more_clusters_than_clients_is_a_config_error_when_the_config_is_built():
    # build_config, not the server: a sweep rejects the run before any run starts
    assert_config_error("flhc", ["flhc.num_clusters=7"], "--set flhc.num_clusters: 7 clusters cannot be formed from 6 clients")


# --- end to end ---------------------------------------------------------------------------------

def test_runs_end_to_end_above_chance_and_logs_the_clusters(tmp_path):
    sets = ["flhc.cluster_round=1", "flhc.num_clusters=2"]
    result = run_cli(tmp_path, "flhc", *sets, smoke=CLUSTERED_SMOKE, flags=["--log-clustering-every", "1"])
    assert 1 / 4 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None  # no global model once clustered
    records = result.clustering
    assert len(records) == 3 and all(r == records[0] for r in records)  # clustered once, in round 1
    assert records[0]["clients"] == list(range(8)) and records[0]["num_clusters"] == 2
    assert len(records[0]["pca"]) == 8
