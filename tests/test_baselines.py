"""The baselines FedProx, FedNova, Ditto and FedRep: the properties each must have, and a run each."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.fednova import normalizer
from fedtail.algorithms.fedprox import proximal_term
from fedtail.algorithms.base import Message
from fedtail.algorithms.fedrep import train_only
from fedtail.config import RunConfig
from fedtail import components
from fedtail.components import build_config
from fedtail.engine.context import ClientContext
from fedtail.engine.simulation import Simulation
from fedtail.components import algorithm_options
from helpers import (
    assert_config_error,
    assert_fails_in_one_line,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    evaluate,
    fit,
    invoke_run,
    run,
    run_cli,
    runtime,
    set_options,
    strip_timing,
)

# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm, assignment, needle",
    [
        ("fedprox", "fedprox.mu=-0.1", "--set fedprox.mu: Input should be greater than or equal to 0"),
        ("ditto", "ditto.lam=-1", "--set ditto.lam: Input should be greater than or equal to 0"),
        ("ditto", "ditto.personal_epochs=0", "--set ditto.personal_epochs"),
        ("fedrep", "fedrep.head_epochs=0", "--set fedrep.head_epochs"),
        ("fedrep", "fedrep.body_epochs=1.5", "--set fedrep.body_epochs"),
        ("fednova", "fednova.mu=0.1", "unknown key; allowed: none"),
        ("fedprox", "fedprox.lam=1", "unknown key; allowed: mu"),
    ],
)
def test_bad_options_are_rejected_before_the_run(algorithm, assignment, needle):
    assert_config_error(algorithm, [assignment], needle)


def test_options_parse_and_default():
    assert algorithm_options(build_config(tiny_raw(algorithm="fedprox"))).mu == 0.01
    assert algorithm_options(build_config(tiny_raw(algorithm="fedprox"), ["fedprox.mu=0.5"])).mu == 0.5
    ditto = algorithm_options(build_config(tiny_raw(algorithm="ditto"), ["algo.personal_epochs=3"]))
    assert ditto.lam == 1.0 and ditto.personal_epochs == 3
    rep = algorithm_options(build_config(tiny_raw(algorithm="fedrep"), ["fedrep.head_epochs=null"]))
    assert rep.head_epochs is None and rep.body_epochs == 1


# --- end to end through the command line ------------------------------------------------------

@pytest.mark.parametrize(
    "algorithm, option, has_global",
    [
        ("fedprox", "fedprox.mu=0.1", True),
        ("fednova", None, True),
        ("ditto", "ditto.lam=0.5", True),
        ("fedrep", "fedrep.head_epochs=2", False),
    ],
)
def test_runs_end_to_end_above_chance(tmp_path, algorithm, option, has_global):
    result = run_cli(tmp_path, algorithm, *([option] if option else []))
    chance = 1 / 5
    assert chance < result.final["personalized_acc"] <= 1
    if has_global:
        assert chance < result.final["global_acc"] <= 1
    else:
        assert result.final["global_acc"] is None
    config = json.loads((result.out / "config.json").read_text())
    if option:
        key, value = option.split("=")
        assert config["options"][key.split(".")[1]] == json.loads(value)
    # every option is written out, the ones not set with their defaults
    assert set(config["options"]) == set(components.algorithm(algorithm).config.model_fields)


def test_cli_rejects_a_negative_mu_with_one_line(tmp_path):
    out = tmp_path / "r"
    assert_fails_in_one_line(invoke_run(out, "fedprox", "fedprox.mu=-1"), "fedprox.mu")
    assert not out.exists()


# --- FedProx -----------------------------------------------------------------------------------


def test_fedprox_with_mu_zero_is_exactly_fedavg():
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    prox_rows, fedprox = run(tiny_config(algorithm="fedprox", options={"mu": 0.0}))
    assert_same(fedprox.server.weights, fedavg.server.weights)
    assert strip_timing(prox_rows) == strip_timing(fed_rows)
    _, pulled = run(tiny_config(algorithm="fedprox", options={"mu": 1.0}))
    assert not torch.equal(pulled.server.weights["head.weight"], fedavg.server.weights["head.weight"])


def test_proximal_term_value_and_pull():
    config = tiny_config(algorithm="fedprox")
    rt = runtime(config)
    model = rt.workspace.model()
    anchor = {k: v + 0.5 for k, v in rt.workspace.init_weights.items()}
    model.load_state_dict(rt.workspace.init_weights)
    term = proximal_term(model, anchor, 0.2)(model, None, None, None)
    n = sum(p.numel() for p in model.parameters())
    assert float(term.detach()) == pytest.approx(0.5 * 0.2 * n * 0.25, rel=1e-5)
    # A larger μ keeps the client closer to the model it received.
    start = rt.workspace.init_weights
    drift = {}
    for mu in (0.0, 5.0):
        set_options(rt, config, mu=mu)
        reply, _ = fit(rt, 2, start)
        drift[mu] = distance(reply.tensors, start)
    assert drift[5.0] < 0.5 * drift[0.0]


# --- FedNova -----------------------------------------------------------------------------------


def test_fednova_normalizer():
    assert normalizer(7, 0.0) == pytest.approx(7.0)
    assert normalizer(3, 0.5) == pytest.approx(1 + 1.5 + 1.75)
    # Σ_k (1 − ρ^k)/(1 − ρ), the total weight heavy-ball momentum gives the gradients
    assert normalizer(20, 0.9) == pytest.approx(sum((1 - 0.9**k) / 0.1 for k in range(1, 21)))


def _digits_resnet(**overrides) -> RunConfig:
    raw = tiny_raw(dataset="digits", model="resnet8", **overrides)
    raw["dataset_options"] = {}
    return build_config(raw)


@pytest.mark.parametrize(
    "make",
    [
        # plain SGD, 100 samples per client: 7 steps each (weight decay set for both: FedNova's
        # reference has the authors' 1e-4, which enters the gradient, not ‖a‖₁)
        lambda algorithm: tiny_config(
            algorithm=algorithm, partition={"scheme": "iid", "num_clients": 4}, train={"weight_decay": 1e-4}
        ),
        # momentum, and BatchNorm buffers (running stats, integer num_batches_tracked); 359-360
        # samples per client, batch 64: 6 steps each
        lambda algorithm: _digits_resnet(
            algorithm=algorithm,
            partition={"scheme": "iid", "num_clients": 4},
            train={"batch_size": 64, "momentum": 0.9, "weight_decay": 0.0},
        ),
    ],
    ids=["mlp-sgd", "resnet8-momentum"],
)
def test_fednova_with_equal_steps_is_fedavg(make):
    rounds = 2
    _, fedavg = run(make("fedavg").model_copy(update={"rounds": rounds}))
    rows, fednova = run(make("fednova").model_copy(update={"rounds": rounds}))
    steps = set(_steps_per_client(fednova))
    assert len(steps) == 1  # the premise: every client took the same number of steps
    for name, value in fedavg.server.weights.items():
        nova = fednova.server.weights[name]
        assert nova.dtype == value.dtype
        # Equal in exact arithmetic; in float32 the two aggregations round differently, and round 2's
        # momentum steps through BatchNorm amplify that to ~1e-4 on some CPUs. A wrong normalisation
        # (momentum's effective step count) changes the update by a factor, far beyond this tolerance.
        assert torch.allclose(nova.double(), value.double(), rtol=1e-3, atol=1e-3), name
    rho = fednova.config.train.momentum
    assert rows[-1]["rounds_log"][-1]["tau_eff"] == pytest.approx(normalizer(steps.pop(), rho))


def _steps_per_client(sim: Simulation) -> list[int]:
    batch = sim.config.train.batch_size
    return [-(-len(c.train) // batch) for c in sim.partition.clients]


def test_fednova_with_unequal_steps_differs_from_fedavg():
    _, fedavg = run(tiny_config(algorithm="fedavg"))
    rows, fednova = run(tiny_config(algorithm="fednova"))
    assert len(set(_steps_per_client(fednova))) > 1
    assert not torch.allclose(fednova.server.weights["head.weight"], fedavg.server.weights["head.weight"], atol=1e-4)
    # τ_eff is the sample-weighted mean of the sampled clients' step counts
    log = rows[-1]["rounds_log"][-1]
    sizes = [len(fednova.partition.clients[c].train) for c in log["clients"]]
    steps = [-(-n // 16) for n in sizes]
    assert log["tau_eff"] == pytest.approx(sum(n * s for n, s in zip(sizes, steps)) / sum(sizes))


def test_fednova_runs_with_its_authors_weight_decay_unless_a_run_sets_one():
    assert tiny_config(algorithm="fednova").train.weight_decay == pytest.approx(1e-4)
    assert tiny_config(algorithm="fednova", train={"weight_decay": 0.0}).train.weight_decay == 0
    assert tiny_config(algorithm="fedavg").train.weight_decay == 0


def test_fednova_client_reports_its_momentum_normalizer():
    config = tiny_config(algorithm="fednova", train={"momentum": 0.9})
    rt = runtime(config)
    reply, _ = fit(rt, 1, rt.workspace.init_weights)
    assert reply.metrics["a_norm"] == pytest.approx(normalizer(int(reply.metrics["num_steps"]), 0.9))
    # the update is normalised: (w^t − w_i) / ‖a_i‖₁
    trained = rt.workspace.model().state_dict()
    w = rt.workspace.init_weights["head.bias"]
    expected = (w - trained["head.bias"]) / reply.metrics["a_norm"]
    assert torch.allclose(reply.tensors["head.bias"], expected)


# --- Ditto -------------------------------------------------------------------------------------


def test_ditto_uploads_the_global_update_never_the_personal_model():
    rt = runtime(tiny_config(algorithm="ditto"))
    start = rt.workspace.init_weights
    reply, state = fit(rt, 0, start)
    assert_same(reply.tensors, rt.workspace.model("main").state_dict())
    personal = state["personal"]
    assert personal.keys() == reply.tensors.keys()
    assert all(not torch.equal(personal[k], reply.tensors[k]) for k in personal)
    # A second round starts from the stored personal model, not from the message.
    reply2, state2 = fit(rt, 0, reply.tensors, state)
    assert not any(torch.equal(state2["personal"][k], reply2.tensors[k]) for k in personal)


def test_ditto_global_model_is_exactly_fedavg():
    """The global half trains first, on the same random stream, so it is FedAvg's model bit for bit."""
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    ditto_rows, ditto = run(tiny_config(algorithm="ditto"))
    assert_same(ditto.server.weights, fedavg.server.weights)
    assert [r["global_acc"] for r in ditto_rows] == [r["global_acc"] for r in fed_rows]
    assert ditto_rows[-1]["personalized_acc"] != pytest.approx(fed_rows[-1]["personalized_acc"])


def test_ditto_large_lambda_keeps_the_personal_model_near_the_global():
    config = tiny_config(algorithm="ditto", train={"local_epochs": 2})
    rt = runtime(config)
    start = rt.workspace.init_weights
    drift = {}
    for lam in (0.0, 10.0):  # lr 0.05 · λ 10 = 0.5: a strong but stable pull
        set_options(rt, config, lam=lam)
        _, state = fit(rt, 2, start)
        drift[lam] = distance(state["personal"], start)
    assert drift[10.0] < 0.2 * drift[0.0]


def test_ditto_evaluates_the_personal_model_if_any_else_its_start():
    """With a personal model, that; without one (never sampled), the received global model
    (``personal_init = received``) or the run's initial model w^0 (``initial``, the reference)."""
    config = tiny_config(algorithm="ditto")
    rt = runtime(config)
    init = rt.workspace.init_weights
    other = {k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(0)) for k, v in init.items()}
    assert rt.options.personal_init == "initial"  # the reference setting

    def correct(tensors, state):
        return evaluate(rt, 3, tensors, state).tensors["correct"]

    assert torch.equal(correct(init, {"personal": other}), correct(other, {"personal": other}))
    assert torch.equal(correct(other, {}), correct(init, {}))  # w^0, whatever arrives
    assert not torch.equal(correct(other, {}), correct(init, {"personal": other}))
    set_options(rt, config, personal_init="received")
    assert torch.equal(correct(other, {}), correct(init, {"personal": other}))  # the message


@pytest.mark.parametrize("personal_init", ["received", "initial"])
def test_ditto_first_personal_model_starts_where_personal_init_says(personal_init):
    config = tiny_config(algorithm="ditto")
    rt = runtime(config)
    set_options(rt, config, personal_init=personal_init)
    init = rt.workspace.init_weights
    received = {k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in init.items()}
    _, first = fit(rt, 2, received)  # the client's first round: no personal model yet
    start = received if personal_init == "received" else init
    _, stored = fit(rt, 2, received, {"personal": start})  # the same round from an explicit start
    assert_same(first["personal"], stored["personal"])
    _, elsewhere = fit(rt, 2, received, {"personal": init if personal_init == "received" else received})
    assert distance(first["personal"], elsewhere["personal"]) > 1e-3


# --- FedRep ------------------------------------------------------------------------------------


def test_fedrep_training_one_part_leaves_the_other_untouched():
    config = tiny_config(algorithm="fedrep")
    rt = runtime(config)
    ctx = ClientContext(1, 1, 123, rt.views.at(1)[1], rt.workspace, rt.options)
    model = ctx.load(rt.workspace.init_weights)
    for part, frozen, keys in ((model.head, model.body, model.body_keys()), (model.body, model.head, model.head_keys())):
        before = ctx.weights(keys=keys)
        trained_before = {k: v.clone() for k, v in part.state_dict().items()}
        stats = train_only(ctx, part, frozen, epochs=2)
        assert stats.steps > 0
        assert_same(ctx.weights(keys=keys), before)
        assert all(not torch.equal(v, trained_before[k]) for k, v in part.state_dict().items())
        assert all(p.requires_grad for p in model.parameters())  # unfrozen afterwards


def test_fedrep_uploads_only_the_body_and_keeps_the_head():
    rt = runtime(tiny_config(algorithm="fedrep"))
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    body = {k: init[k] for k in model.body_keys()}
    reply, state = fit(rt, 4, body)
    assert set(reply.tensors) == set(model.body_keys())
    assert not set(reply.tensors) & set(model.head_keys())
    assert set(state["head"]) == set(model.head_keys())
    assert not torch.equal(state["head"]["head.weight"], init["head.weight"])
    # Evaluation: the global body with the client's own head (or the initial head).
    ctx = ClientContext(4, 1, 0, rt.views.at(1)[4], rt.workspace, rt.options)
    for client_state, head in ((state, state["head"]), ({}, {k: init[k] for k in model.head_keys()})):
        ctx.load(body | head)
        expected = ctx.evaluate()
        got = evaluate(rt, 4, body, client_state)
        assert torch.equal(got.tensors["correct"], expected.tensors["correct"])
        assert torch.equal(got.tensors["total"], expected.tensors["total"])


def test_fedrep_uplink_is_bodies_only_in_a_run():
    config = tiny_config(algorithm="fedrep", rounds=2, options={"final_finetune": False})
    rows, sim = run(config)
    model = sim.workspace.model()
    body_bytes = sum(v.numel() * v.element_size() for k, v in model.state_dict().items() if k in model.body_keys())
    assert sim.meter.bytes_up == sim.meter.bytes_down == 2 * config.clients_per_round * body_bytes
    sampled = {c for row in rows for r in row["rounds_log"] for c in r["clients"]}
    assert {c for c, s in sim.client_state.items() if "head" in s} == sampled
    assert rows[-1]["global_acc"] is None


def test_fedrep_reference_is_the_authors_code():
    config = build_config(tiny_raw(algorithm="fedrep"))
    assert (config.train.momentum, config.train.weight_decay, config.train.grad_clip) == (0.5, 1e-4, None)
    assert algorithm_options(config).final_finetune
    bare = build_config(tiny_raw(algorithm="fedrep"), reference=False)
    assert (bare.train.momentum, bare.train.weight_decay) == (0.0, 0.0) and not algorithm_options(bare).final_finetune


def test_fedrep_finetune_trains_the_head_alone_for_at_least_ten_epochs():
    from fedtail.engine.executors import Task

    config = tiny_config(algorithm="fedrep", options={"head_epochs": 2})
    rt = runtime(config)
    model = rt.workspace.model()
    init = rt.workspace.init_weights
    body = {k: init[k] + 0.01 for k in model.body_keys()}
    head = {k: init[k] - 0.01 for k in model.head_keys()}
    result = rt.run(Task(3, 1, 0, Message("finetune", body), {"head": head}))
    assert result.reply.tensors == {} and set(result.state) == {"head"}
    assert distance(result.state["head"], head) > 1e-3
    assert result.reply.metrics["num_steps"] == 10 * -(-len(rt.views.at(1)[3].train) // config.train.batch_size)
    # the head is trained on the body it is sent (the final global body)
    other = rt.run(Task(3, 1, 0, Message("finetune", {k: v + 0.05 for k, v in body.items()}), {"head": head}))
    assert distance(other.state["head"], result.state["head"]) > 1e-4
    again = rt.run(Task(3, 1, 0, Message("finetune", body), {"head": head}))
    assert_same(again.state["head"], result.state["head"])


@pytest.mark.parametrize("final_finetune", [True, False])
def test_fedrep_final_round_fine_tunes_every_clients_head(final_finetune):
    config = tiny_config(algorithm="fedrep", rounds=2, options={"final_finetune": final_finetune})
    rows, sim = run(config)
    model = sim.workspace.model()
    body_bytes = sum(v.numel() * v.element_size() for k, v in model.state_dict().items() if k in model.body_keys())
    sampled = {c for row in rows for r in row["rounds_log"] for c in r["clients"]}
    with_head = {c for c, s in sim.client_state.items() if "head" in s}
    extra = config.partition.num_clients * body_bytes if final_finetune else 0
    assert sim.meter.bytes_down == 2 * config.clients_per_round * body_bytes + extra
    assert with_head == (set(range(config.partition.num_clients)) if final_finetune else sampled)
    assert with_head > sampled or not final_finetune


def test_fedrep_serial_and_parallel_agree_exactly():
    """Heads kept in client state and partial loads behave the same in worker processes."""
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedrep"))
