"""FeSEM: the E- and M-steps, the server's bookkeeping, K = 1 as averaging, a run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.components import algorithm_options, build_config
from fedtail.algorithms.clustering import flatten, float_keys
from fedtail.algorithms.fesem import e_step, m_step
from helpers import ScriptedComm, assert_config_error, filled, reply, run, run_cli, simulation, without_global


# --- the EM steps on hand-made vectors -----------------------------------------------------------


def test_e_step_assigns_each_model_to_the_nearest_centre():
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    models = torch.tensor([[1.0, 1.0], [9.0, -2.0], [4.0, 6.0], [6.0, 4.0], [5.0, 0.0]])
    # [4, 6]: 52 to centre 0, 72 to centre 1, 32 to centre 2; [5, 0] is a tie, which goes to the lowest k
    assert e_step(models, centres).tolist() == [0, 1, 2, 1, 0]


def test_m_step_centre_is_the_member_mean_and_empty_clusters_keep_theirs():
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [-7.0, 7.0]])
    models = torch.tensor([[1.0, 2.0], [3.0, 4.0], [11.0, 0.0]])
    labels = np.array([0, 0, 1])
    plain = m_step(models, labels, centres)
    assert torch.allclose(plain, torch.tensor([[2.0, 3.0], [11.0, 0.0], [-7.0, 7.0]]))
    weighted = m_step(models, labels, centres, weights=np.array([3.0, 1.0, 5.0]))
    assert torch.allclose(weighted[0], torch.tensor([1.5, 2.5]))
    assert torch.equal(centres, torch.tensor([[0.0, 0.0], [10.0, 0.0], [-7.0, 7.0]]))  # not changed in place


# --- the server ----------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted, m_step", [(False, "all"), (True, "all"), (False, "round"), (True, "round")])
def test_server_round_uses_every_known_model_and_sends_each_client_its_centre(weighted, m_step):
    options = {"weighted": weighted, "init": "random", "cold_start": "random", "m_step": m_step}
    sim = simulation(tiny_config(algorithm="fesem", options=options, log_clustering_every=1))
    server = sim.server
    template = sim.server_ctx.init_weights
    keys = float_keys(template)
    server.centres = torch.stack([flatten(filled(template, 0.0), keys), flatten(filled(template, 10.0), keys)])
    # client 3 uploaded in an earlier round and is not sampled now; client 2 was assigned before too
    server.models = {2: flatten(filled(template, 8.0), keys), 3: flatten(filled(template, 9.0), keys)}
    server.labels = {2: 1, 3: 1}
    server.cold_labels = np.array([1, 0, 0, 1, 0, 1])
    uploads = {0: 1.0, 1: 11.0, 2: 10.5}
    comm = ScriptedComm({c: reply(filled(template, v), 1.0) for c, v in uploads.items()})
    server.run_round(2, [0, 1, 2], comm)
    # assigned client 2 gets its centre; never-assigned clients 0 and 1 get their fixed random one
    assert {c: float(m.tensors["head.bias"][0]) for c, m in comm.sent.items()} == {0: 10.0, 1: 0.0, 2: 10.0}
    assert server.labels == {0: 0, 1: 1, 2: 1, 3: 1}
    n = sim.server_ctx.client_train_sizes
    assert len({n[1], n[2], n[3]}) > 1  # the premise of the weighted case
    # the stale upload of client 3 joins the E-step always, the M-step only under m_step=all
    members = {1: 11.0, 2: 10.5, 3: 9.0} if m_step == "all" else {1: 11.0, 2: 10.5}
    if weighted:
        expected = sum(n[c] * v for c, v in members.items()) / sum(n[c] for c in members)
    else:
        expected = sum(members.values()) / len(members)
    assert torch.allclose(server.centres[0], torch.ones(len(server.centres[0])))
    assert torch.allclose(server.centres[1], torch.full_like(server.centres[1], float(expected)))
    record = comm.logged["clustering"]
    assert record["clients"] == [0, 1, 2, 3] and record["clusters"] == [0, 1, 1, 1] and len(record["pca"]) == 4
    # evaluation follows the same rule: the assigned centre, else the fixed random one
    for cid in (1, 5):  # client 1 is assigned to centre 1; client 5 has never uploaded, its cold label is 1
        assert float(server.evaluation_message(cid).tensors["head.bias"][0]) == pytest.approx(expected)
    assert float(server.evaluation_message(4).tensors["head.bias"][0]) == pytest.approx(1.0)  # cold label 0


def test_cold_start_by_loss_sends_all_centres_until_the_first_upload():
    options = {"num_clusters": 3, "init": "random", "cold_start": "loss"}
    sim = simulation(tiny_config(algorithm="fesem", options=options))
    server = sim.server
    assert server.evaluation_message(4).config["models"] == 3
    server.labels = {4: 2}
    msg = server.evaluation_message(4)
    assert "models" not in msg.config
    assert torch.equal(flatten(msg.tensors, server.keys), server.centres[2])


def test_random_cold_labels_are_balanced_and_seeded():
    first = simulation(tiny_config(algorithm="fesem", options={"num_clusters": 3})).server.cold_labels
    again = simulation(tiny_config(algorithm="fesem", options={"num_clusters": 3})).server.cold_labels
    other = simulation(tiny_config(algorithm="fesem", seed=1, options={"num_clusters": 3})).server.cold_labels
    assert np.bincount(first).tolist() == [2, 2, 2]
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def _first_round(num_clusters: int, **overrides):
    options = {"num_clusters": num_clusters, "init": "first-round", "cold_start": "loss"}
    return run(tiny_config(algorithm="fesem", options=options, **overrides))


def test_first_round_init_waits_for_k_clients_then_seeds_with_trained_models_only():
    # 3 of 6 clients a round and K = 4: after round 1 there are too few models to seed from
    _, sim = _first_round(4, rounds=1)
    assert sim.server.centres is None and sim.server.labels == {} and len(sim.server.models) == 3
    rows, sim = _first_round(4, rounds=3)
    server = sim.server
    seen = [set(rows[0]["rounds_log"][0]["clients"])]
    for row in rows[1:]:
        seen.append(seen[-1] | set(row["rounds_log"][0]["clients"]))
    assert len(seen[0]) == 3 and len(seen[-1]) >= 4  # the premise: round 1 alone is not enough
    assert sorted(server.labels) == sorted(seen[-1])
    # every centre is a mean of trained models (near the initial model), none a random initialisation
    init = flatten(sim.server_ctx.init_weights, server.keys)
    models = torch.stack([server.models[c] for c in sorted(server.models)])
    spread = float((models - init).norm(dim=1).max())
    assert float((server.centres - init).norm(dim=1).max()) <= spread + 1e-4
    assert len(set(server.labels.values())) >= 2


def test_first_round_init_with_more_centres_than_clients_fills_with_random_ones():
    rows, sim = _first_round(8, rounds=1, fraction=1.0)
    server = sim.server
    assert sorted(server.models) == list(range(6)) and sorted(server.labels.values()) == list(range(6))
    # six models for eight centres: each model is its own centre, the other two random initialisations
    models = torch.stack([server.models[c] for c in range(6)])
    assert torch.equal(server.centres[:6][[server.labels[c] for c in range(6)]], models)
    init = flatten(sim.server_ctx.init_weights, server.keys)
    far = (server.centres[6:] - init).norm(dim=1)
    assert float(far.min()) > 10 * float((models - init).norm(dim=1).max())


def test_common_init_starts_k_copies_and_keeps_the_random_assignment_until_every_centre_is_built():
    options = {"num_clusters": 3, "init": "common", "cold_start": "random", "m_step": "round"}
    sim = simulation(tiny_config(algorithm="fesem", options=options, log_clustering_every=1))
    server = sim.server
    template = sim.server_ctx.init_weights
    init = flatten(template, server.keys)
    assert all(torch.equal(c, init) for c in server.centres)
    server.cold_labels = np.array([0, 1, 0, 1, 2, 2])

    def round_(rnd, uploads):
        comm = ScriptedComm({c: reply(filled(template, v), 1.0) for c, v in uploads.items()})
        server.run_round(rnd, sorted(uploads), comm)
        return comm

    # rounds 1-2: only centres 0 and 1 get members; centre 2 is still the initial model, so
    # clients keep their random centres although client 1's model (1.1) is nearest centre 0
    round_(1, {0: 1.0, 1: 3.0, 2: 1.2})
    assert server.labels == {0: 0, 1: 1, 2: 0} and server.unbuilt == {2}
    assert torch.allclose(server.centres[0], torch.full_like(init, 1.1))
    assert torch.allclose(server.centres[1], torch.full_like(init, 3.0))
    assert torch.equal(server.centres[2], init)
    round_(2, {1: 1.1})
    assert server.labels == {0: 0, 1: 1, 2: 0}
    assert torch.allclose(server.centres[1], torch.full_like(init, 1.1))  # the round's member only
    # round 3 builds centre 2 from client 4; from round 4 on the E-step assigns by distance
    round_(3, {4: 7.0})
    assert server.unbuilt == set() and server.labels[4] == 2
    assert torch.allclose(server.centres[2], torch.full_like(init, 7.0))
    round_(4, {3: 6.5, 0: 1.0})  # client 3 (random centre 1) is nearest centre 2
    # clients 1 and 2 (stale 1.1 and 1.2) tie between centres 0 and 1 (both 1.1): the lowest k
    assert server.labels == {0: 0, 1: 0, 2: 0, 3: 2, 4: 2}
    assert torch.allclose(server.centres[2], torch.full_like(init, 6.5))  # this round's members: client 3


def test_the_reference_is_the_authors_common_start_and_random_first_assignment():
    opts = algorithm_options(tiny_config(algorithm="fesem"))
    assert (opts.init, opts.cold_start, opts.m_step) == ("common", "random", "round")
    bare = algorithm_options(build_config(tiny_raw(algorithm="fesem"), reference=False))
    assert (bare.init, bare.cold_start, bare.m_step) == ("first-round", "loss", "all")


def test_one_centre_with_every_client_sampled_is_plain_or_weighted_averaging():
    everyone = {"fraction": 1.0, "rounds": 2}
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg", **everyone))
    rows, weighted = run(tiny_config(algorithm="fesem", options={"num_clusters": 1, "weighted": True}, **everyone))
    assert torch.equal(weighted.server.centres[0], flatten(fedavg.server.weights, weighted.server.keys))
    assert without_global(rows) == without_global(fed_rows)
    _, plain = run(tiny_config(algorithm="fesem", options={"num_clusters": 1}, rounds=1, fraction=1.0))
    models = torch.stack([plain.server.models[c] for c in range(6)]).double()
    assert torch.allclose(plain.server.centres[0].double(), models.mean(dim=0), atol=1e-6)
    sizes = torch.as_tensor(plain.server_ctx.client_train_sizes, dtype=torch.float64)
    by_size = (models * sizes[:, None]).sum(dim=0) / sizes.sum()
    assert not torch.allclose(plain.server.centres[0].double(), by_size, atol=1e-6)


# --- options, a run ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fesem.num_clusters=0", "--set fesem.num_clusters: Input should be greater than or equal to 1"),
        ("fesem.init=kmeans", "--set fesem.init"),
        ("fesem.cold_start=nearest", "--set fesem.cold_start"),
        ("fesem.weighted=maybe", "--set fesem.weighted"),
        ("fesem.m_step=stale", "--set fesem.m_step"),
        ("fesem.cold_start=loss", "init=common needs cold_start=random"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("fesem", [assignment], needle)


def test_runs_end_to_end_and_logs_every_assigned_client(tmp_path):
    flags = ["--rounds", "3", "--log-clustering-every", "1"]
    result = run_cli(tmp_path, "fesem", "fesem.num_clusters=2", "fesem.cold_start=random", flags=flags)
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    assert len(result.logs) == 3
    seen: set[int] = set()
    for log in result.logs:
        seen |= set(log["clients"])
        record = log["clustering"]
        assert record["clients"] == sorted(seen)  # every client with an upload so far
        assert len(record["clusters"]) == len(record["pca"]) == len(seen)
        assert set(record["clusters"]) <= {0, 1}
    assert result.rows[-1]["bytes_down"] == result.rows[-1]["bytes_up"]  # one model each way (random cold start)
