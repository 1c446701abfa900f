"""FedGroup: EDC clustering, newcomer cold start, in-group averaging, options, a run."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.aggregate import weighted_mean
from fedtail.algorithms.clustering import float_keys, flatten
from fedtail.algorithms.fedgroup import (
    decomposed_similarity,
    edc,
    edc_groups,
    inter_group_mix,
    most_similar,
    pretrain_count,
    svd_directions,
)
from fedtail.components import build_config
from fedtail.errors import ConfigError
from fedtail.components import algorithm_options
from helpers import (
    CLUSTERED_SMOKE,
    PlantedUpdateComm,
    assert_config_error,
    assert_fails_in_one_line,
    assert_same,
    invoke_run,
    parity_deltas,
    planted_updates,
    run,
    run_cli,
    same_partition,
    simulation,
    strip_timing,
)


# --- the server's steps on hand-made vectors ---------------------------------------------------


def test_edc_clustering_separates_update_directions_whatever_their_length():
    rows, truth = planted_updates(groups=2)
    labels, points, directions = edc_groups(rows, k=2, dims=3, seed=0)
    assert same_partition(labels, truth)
    assert points.shape == (len(rows), 3) and directions.shape == (3, rows.shape[1])
    distances = edc(rows, directions)
    same = truth[:, None] == truth[None, :]
    assert distances[same].max() < distances[~same].min()
    # Plain Euclidean distances do not separate the groups: lengths dominate them.
    euclidean = torch.cdist(rows, rows)
    assert euclidean[same].max() > euclidean[~same].min()


def test_three_planted_groups_and_the_svd_directions():
    rows, truth = planted_updates(groups=3, per_group=5, seed=3)
    labels, _, _ = edc_groups(rows, k=3, dims=3, seed=1)
    assert same_partition(labels, truth)
    v = svd_directions(rows[:2], dims=5, seed=0)
    assert v.shape == (2, rows.shape[1])  # m capped at the number of updates
    assert torch.allclose(v @ v.T, torch.eye(2, dtype=v.dtype), atol=1e-5)  # float32 Gram entries (clustering)
    # the similarity vectors do not change when an update is scaled
    scaled = rows * torch.linspace(0.1, 9, len(rows))[:, None]
    assert torch.allclose(decomposed_similarity(scaled, v), decomposed_similarity(rows, v))


def test_gram_svd_equals_the_exact_svd_and_the_groups_of_the_randomized_one():
    """Issue 21: v_k from the Gram matrix are the exact singular vectors (up to sign); the groups are
    those of the former randomized TruncatedSVD route."""
    import numpy as np
    from sklearn.cluster import KMeans
    from sklearn.decomposition import TruncatedSVD
    from sklearn.metrics import adjusted_rand_score

    rows, truth = planted_updates(groups=4, per_group=6, seed=5)
    _, _, vt = np.linalg.svd(rows.double().numpy(), full_matrices=False)
    v = svd_directions(rows, dims=3).numpy()
    for k in range(3):
        assert abs(v[k] @ vt[k]) == pytest.approx(1.0, abs=1e-5)
    labels, points, _ = edc_groups(rows, k=4, dims=3, seed=2)
    svd = TruncatedSVD(n_components=3, algorithm="randomized", random_state=2).fit(rows.double().numpy())
    old_points = decomposed_similarity(rows, torch.from_numpy(svd.components_))
    old = KMeans(n_clusters=4, n_init=10, random_state=2).fit_predict(old_points.numpy())
    assert adjusted_rand_score(old, labels) == pytest.approx(1.0) and same_partition(labels, truth)
    # s_i read off the Gram matrix equals the cosines with the directions (up to each axis' sign)
    np.testing.assert_allclose(np.abs(points.numpy()), np.abs(old_points.numpy()), atol=1e-4)


def test_a_newcomer_joins_the_group_whose_direction_is_most_similar():
    references = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    newcomers = torch.tensor([[5.0, 1.0, 0.0], [0.1, 0.3, 0.2], [-1.0, 0.1, 0.1], [0.2, -3.0, 0.0]])
    # by cosine, not distance: the second row is nearer (L2) to reference 0 but points along 1
    assert most_similar(newcomers, references).tolist() == [0, 1, 1, 0]


def test_inter_group_mix():
    models = torch.tensor([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0]])
    assert torch.equal(inter_group_mix(models, 0.0), models.double())
    mixed = inter_group_mix(models, 0.5)
    w = [0.5 / 2.0, 0.5 / 1.0]  # η/‖θ_j‖ of groups 1 and 2
    expected = (models[0].double() + w[0] * models[1] + w[1] * models[2]) / (1 + sum(w))
    assert torch.allclose(mixed[0], expected)


def test_pretrain_count():
    assert pretrain_count(None, 5, 100) == 100  # α·K = 100
    assert pretrain_count(None, 2, 100) == 40
    assert pretrain_count(0.5, 2, 6) == 3
    assert pretrain_count(4, 2, 6) == 4
    with pytest.raises(ConfigError, match="--set fedgroup.pretrain_clients"):
        pretrain_count(0.1, 2, 6)  # 1 client for 2 groups
    with pytest.raises(ConfigError, match="--set fedgroup.pretrain_clients"):
        pretrain_count(7, 2, 6)


# --- the server through a channel with planted updates ------------------------------------------


@pytest.mark.parametrize("newcomer_start", ["init", "global_mean"])
def test_cold_start_groups_by_direction_and_newcomers_join_their_direction(newcomer_start):
    options = {"num_groups": 2, "pretrain_clients": 4, "newcomer_start": newcomer_start}
    sim = simulation(tiny_config(algorithm="fedgroup", options=options, log_clustering_every=1))
    server = sim.server
    comm = PlantedUpdateComm(parity_deltas(sim), sim.server_ctx.client_train_sizes)
    server.run_round(1, list(range(6)), comm)
    pretrained = comm.logged["clustering"]["pretrained"]
    newcomers = sorted(set(range(6)) - set(pretrained))
    assert [kind for kind, _ in comm.calls] == ["pretrain", "pretrain", "fit"]
    assert comm.calls[0][1] == pretrained and comm.calls[1][1] == newcomers and comm.calls[2][1] == list(range(6))
    assert same_partition([server.group_of[c] for c in range(6)], [c % 2 for c in range(6)])
    # the log covers every assigned client, with its group and a point of the scatter
    record = comm.logged["clustering"]
    assert record["clients"] == list(range(6)) and record["newcomers"] == newcomers
    assert record["clusters"] == [server.group_of[c] for c in range(6)] and len(record["pca"]) == 6


def test_group_models_start_as_member_means_and_average_only_their_members():
    sim = simulation(tiny_config(algorithm="fedgroup", options={"num_groups": 2, "pretrain_clients": 6}))
    server = sim.server
    init = sim.server_ctx.init_weights
    comm = PlantedUpdateComm(parity_deltas(sim), sim.server_ctx.client_train_sizes)
    server.group_cold_start(comm)
    pretrain_models = dict(comm.replies)
    for g, model in enumerate(server.groups):
        members = [c for c in range(6) if server.group_of[c] == g]
        expected = weighted_mean((pretrain_models[c].tensors, 1.0) for c in members)  # plain mean at cold start
        assert all(torch.allclose(model[k], expected[k], atol=1e-6) for k in float_keys(init))

    # One round with clients 0 and 2 only (one group): that group is their sample-weighted mean.
    before = [dict(m) for m in server.groups]
    server.train_groups([0, 2], comm)
    g = server.group_of[0]
    sizes = sim.server_ctx.client_train_sizes
    expected = weighted_mean((comm.replies[c].tensors, float(sizes[c])) for c in (0, 2))
    assert_same(server.groups[g], expected)
    assert_same(server.groups[1 - g], before[1 - g])  # no member sampled: unchanged
    # its latest direction is the change just made; the other group keeps its cold-start centre
    keys = float_keys(init)
    assert torch.allclose(server.latest[g], flatten(expected, keys) - flatten(before[g], keys))
    assert torch.equal(server.latest[1 - g], server.centres[1 - g])


def test_group_init_from_the_initial_model_and_evaluation_rules():
    options = {"num_groups": 2, "pretrain_clients": 3, "group_init": "init"}
    sim = simulation(tiny_config(algorithm="fedgroup", options=options))
    server = sim.server
    init = sim.server_ctx.init_weights
    assert_same(server.evaluation_message(0).tensors, init)  # before any group: the initial model
    comm = PlantedUpdateComm(parity_deltas(sim), sim.server_ctx.client_train_sizes)
    pretrained = server.group_cold_start(comm)
    assert all(torch.equal(m[k], init[k]) for m in server.groups for k in init)
    server.train_groups(pretrained, comm)
    outsider = next(c for c in range(6) if c not in server.group_of)
    assigned = pretrained[0]
    assert_same(server.evaluation_message(assigned).tensors, server.groups[server.group_of[assigned]])
    aux = weighted_mean((m, 1.0) for m in server.groups)
    assert_same(server.evaluation_message(outsider).tensors, aux)
    assert_same(server.global_weights(), aux)


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fedgroup.num_groups=1", "--set fedgroup.num_groups"),
        ("fedgroup.svd_dims=0", "--set fedgroup.svd_dims"),
        ("fedgroup.pretrain_clients=2.5", "must be a whole number"),
        ("fedgroup.pretrain_clients=0", "--set fedgroup.pretrain_clients"),
        ("fedgroup.pretrain_clients=7", "7 pre-training clients cannot form 5 groups"),  # 6 clients
        ("fedgroup.eta_g=-0.1", "--set fedgroup.eta_g"),
        ("fedgroup.mu=-1", "--set fedgroup.mu"),
        ("fedgroup.newcomer_start=random", "--set fedgroup.newcomer_start"),
        ("fedgroup.group_init=zeros", "--set fedgroup.group_init"),
        ("fedgroup.groups=3", "unknown key"),
    ],
)
def test_bad_fedgroup_options_are_rejected(assignment, needle):
    assert_config_error("fedgroup", [assignment], needle)


def test_options_parse_and_default():
    opts = algorithm_options(build_config(tiny_raw(algorithm="fedgroup")))
    assert (opts.num_groups, opts.svd_dims, opts.pretrain_clients, opts.eta_g, opts.mu) == (5, 3, None, 0.0, 0.0)
    count = algorithm_options(build_config(tiny_raw(algorithm="fedgroup"), ["fedgroup.num_groups=2", "fedgroup.pretrain_clients=4"]))
    assert count.pretrain_clients == 4


# --- end to end ---------------------------------------------------------------------------------

def test_runs_end_to_end_above_chance_and_logs_the_groups(tmp_path):
    sets = ["fedgroup.num_groups=2", "fedgroup.pretrain_clients=0.5", "fedgroup.eta_g=0.1"]
    result = run_cli(tmp_path, "fedgroup", *sets, smoke=CLUSTERED_SMOKE, flags=["--log-clustering-every", "1"])
    assert 1 / 4 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is not None  # the auxiliary global model
    logs = result.logs
    assert len(logs) == 3 and len(logs[0]["clustering"]["pretrained"]) == 4
    assert any(log["clustering"]["newcomers"] for log in logs)  # the newcomer cold start ran too
    seen: set[int] = set(logs[0]["clustering"]["pretrained"])
    for log in logs:
        record = log["clustering"]
        seen |= set(log["clients"])
        assert set(record["clients"]) == seen  # every client assigned so far, and only those
        assert len(record["clusters"]) == len(record["pca"]) == len(record["clients"])
        assert set(record["clusters"]) <= {0, 1}


def test_too_few_pretraining_clients_fail_with_one_line(tmp_path):
    sets = ["fedgroup.num_groups=3", "fedgroup.pretrain_clients=2"]
    result = invoke_run(tmp_path / "r", "fedgroup", *sets, smoke=CLUSTERED_SMOKE)
    assert_fails_in_one_line(result, "fedgroup.pretrain_clients")


def test_fedgroup_is_deterministic_given_the_seed():
    """Pre-training set, SVD and k-means draw from the run's seed only.

    (Serial and parallel runs would agree as for FedAvg, since the client half keeps no state;
    the process-pool check costs about 30 s here and is left to test_engine.)
    """
    config = tiny_config(algorithm="fedgroup", rounds=2, options={"num_groups": 2, "pretrain_clients": 3})
    first, a = run(config)
    second, b = run(config)
    assert strip_timing(first) == strip_timing(second)
    assert a.server.group_of == b.server.group_of
    other, _ = run(config.model_copy(update={"seed": 1}))
    assert strip_timing(other) != strip_timing(first)
