"""IFCA: the lowest-loss cluster choice, per-cluster averaging, K = 1 as FedAvg, a run."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.components import algorithm_options, build_config
from fedtail.algorithms.base import Message
from fedtail.algorithms.ifca import pack_models, unpack_models
from fedtail.engine.context import ClientContext
from fedtail.engine.executors import ClientRuntime, Task
from fedtail.models import build_model
from helpers import (
    ScriptedComm,
    assert_config_error,
    assert_same,
    distance,
    filled,
    reply,
    run,
    run_cli,
    runtime,
    simulation,
    without_global,
)


def call(rt: ClientRuntime, cid: int, msg: Message, call: int = 0) -> Message:
    return rt.run(Task(cid, 1, call, msg, {}, read_only=msg.kind == "evaluate")).reply


# --- the client's choice -----------------------------------------------------------------------


def test_client_trains_and_evaluates_the_model_of_lowest_training_loss():
    rt = runtime(tiny_config(algorithm="ifca"))
    cid = 2
    # one model fitted to this client's data, one fresh random initialisation
    ctx = ClientContext(cid, 1, 7, rt.views.at(1)[cid], rt.workspace, rt.options)
    ctx.load(rt.workspace.init_weights)
    ctx.train(epochs=5)
    fitted = ctx.weights()
    fitted_loss = ctx.train_loss()
    torch.manual_seed(123)
    dataset = rt.workspace.dataset
    fresh = build_model(rt.config.model, dataset.input_shape, dataset.num_classes).state_dict()
    ctx.load(fresh)
    assert fitted_loss < ctx.train_loss()  # the premise

    for models, expected in (([fresh, fitted], 1), ([fitted, fresh], 0)):
        reply = call(rt, cid, pack_models(models))
        assert reply.metrics["choice"] == expected
        assert distance(reply.tensors, fitted) < distance(reply.tensors, fresh)  # trained from the fitted one
        scored = call(rt, cid, pack_models(models, kind="evaluate"))
        alone = call(rt, cid, Message("evaluate", fitted))
        assert torch.equal(scored.tensors["correct"], alone.tensors["correct"])


def test_exact_ties_are_broken_at_random_and_plain_messages_are_one_model():
    rt = runtime(tiny_config(algorithm="ifca", options={"init": "common"}))
    same = rt.workspace.init_weights
    message = pack_models([same, same, same])
    choices = {int(call(rt, cid, message, call=c).metrics["choice"]) for cid in range(6) for c in range(2)}
    assert len(choices) > 1  # the lowest index every time would be a degenerate split
    assert unpack_models(Message("fit", same)) == [same]
    packed = unpack_models(pack_models([same, same]))
    assert len(packed) == 2 and all(m.keys() == same.keys() for m in packed)


# --- the server --------------------------------------------------------------------------------


def test_initial_models_random_or_common():
    sim = simulation(tiny_config(algorithm="ifca", options={"num_clusters": 3}))
    models = sim.server.models
    assert_same(models[0], sim.server_ctx.init_weights)  # cluster 0: the run's common start
    assert not torch.equal(models[1]["head.weight"], models[0]["head.weight"])
    assert not torch.equal(models[1]["head.weight"], models[2]["head.weight"])
    again = simulation(tiny_config(algorithm="ifca", options={"num_clusters": 3})).server.models
    assert all(torch.equal(a["head.weight"], b["head.weight"]) for a, b in zip(models, again))
    common = simulation(tiny_config(algorithm="ifca", options={"num_clusters": 3, "init": "common"})).server.models
    assert all(torch.equal(m["head.weight"], models[0]["head.weight"]) for m in common)


@pytest.mark.parametrize("weighting, mean", [("samples", 3.25), ("uniform", 2.5)])  # (10·1 + 30·4)/40, (1 + 4)/2
def test_server_sends_all_models_and_averages_only_within_each_cluster(weighting, mean):
    options = {"num_clusters": 3, "weighting": weighting}
    sim = simulation(tiny_config(algorithm="ifca", options=options, log_clustering_every=1))
    server = sim.server
    before = [dict(m) for m in server.models]
    template = before[0]

    def upload(value: float, n: float, choice: int) -> Message:
        return reply(filled(template, value), n, choice=float(choice))

    comm = ScriptedComm({0: upload(1.0, 10, 0), 1: upload(4.0, 30, 0), 4: upload(7.0, 5, 2)})
    server.run_round(1, [0, 1, 4], comm)
    model_bytes = sum(v.numel() * v.element_size() for v in template.values())
    assert all(m.nbytes == 3 * model_bytes and m.config["models"] == 3 for m in comm.sent.values())
    assert all(torch.allclose(v, torch.full_like(v, mean)) for v in server.models[0].values())
    assert_same(server.models[1], before[1])  # nobody picked cluster 1
    assert all(torch.equal(v, torch.full_like(v, 7.0)) for v in server.models[2].values())
    record = comm.logged["clustering"]
    assert record["clients"] == [0, 1, 4] and record["clusters"] == [0, 0, 2] and len(record["pca"]) == 3
    # evaluation hands every client all K models
    assert server.evaluation_message(5).config["models"] == 3


def test_the_reference_averages_uniformly_and_the_default_by_samples():
    assert algorithm_options(tiny_config(algorithm="ifca")).weighting == "uniform"  # the authors' code
    bare = algorithm_options(build_config(tiny_raw(algorithm="ifca"), reference=False))
    assert bare.weighting == "samples"  # a stored config without the option: the earlier behaviour


def test_one_cluster_is_exactly_fedavg():
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    rows, ifca = run(tiny_config(algorithm="ifca", options={"num_clusters": 1, "weighting": "samples"}))
    assert_same(ifca.server.models[0], fedavg.server.weights)
    assert without_global(rows) == without_global(fed_rows)
    # two identical starting models split the clients at random: no longer FedAvg
    _, two = run(tiny_config(algorithm="ifca", options={"num_clusters": 2, "init": "common"}))
    assert not torch.equal(two.server.models[0]["head.weight"], fedavg.server.weights["head.weight"])


# --- options, a run ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("ifca.num_clusters=0", "--set ifca.num_clusters: Input should be greater than or equal to 1"),
        ("ifca.init=kmeans", "--set ifca.init"),
        ("ifca.weight_sharing=true", "unknown key; allowed: init, num_clusters"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("ifca", [assignment], needle)


def test_runs_end_to_end_logging_clusters_and_k_models_down(tmp_path):
    result = run_cli(tmp_path, "ifca", "ifca.num_clusters=3", flags=["--log-clustering-every", "1"])
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert result.final["global_acc"] is None
    logs = result.logs
    assert len(logs) == 2
    for log in logs:
        record = log["clustering"]
        assert record["clients"] == log["clients"] and set(record["clusters"]) <= {0, 1, 2}
    assert result.rows[-1]["bytes_down"] == 3 * result.rows[-1]["bytes_up"]  # K models down, one up
