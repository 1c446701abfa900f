"""MOON: the contrastive term, μ = 0 as FedAvg, the stored previous model, a run."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_config
from fedtail.algorithms.moon import contrastive_loss, contrastive_term
from fedtail.engine.context import ClientContext, derive_seed
from fedtail.components import algorithm_options
from helpers import (
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    fit,
    run,
    run_cli,
    runtime,
    strip_timing,
)

# --- the contrastive term -----------------------------------------------------------------------


def test_contrastive_loss_on_hand_made_features():
    # cos(z, z_glob) = 1, cos(z, z_prev) = 0, τ = 0.5: −log(e²/(e² + e⁰)) = log(1 + e⁻²)
    z = torch.tensor([[2.0, 0.0]])
    value = contrastive_loss(z, torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 0.5)
    assert float(value) == pytest.approx(math.log(1 + math.exp(-2)))
    # the same representation as global and previous: log 2 whatever τ
    same = torch.tensor([[1.0, -2.0, 0.5]])
    assert float(contrastive_loss(same * 3, same, same, 0.1)) == pytest.approx(math.log(2))
    # random rows against the formula written out, averaged over the batch
    g = torch.Generator().manual_seed(0)
    z, zg, zp = (torch.randn(7, 5, generator=g, dtype=torch.float64) for _ in range(3))
    tau = 0.3

    def cos(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    pos, neg = torch.exp(cos(z, zg) / tau), torch.exp(cos(z, zp) / tau)
    expected = (-torch.log(pos / (pos + neg))).mean()
    assert float(contrastive_loss(z, zg, zp, tau)) == pytest.approx(float(expected), rel=1e-12)


def test_term_uses_the_frozen_models_on_the_batch_and_weights_by_mu():
    rt = runtime(tiny_config(algorithm="moon"))
    init = rt.workspace.init_weights
    glob = rt.workspace.model("global")
    glob.load_state_dict(init)
    prev = rt.workspace.model("previous")
    prev.load_state_dict({k: v * 1.5 + 0.1 for k, v in init.items()})
    term = contrastive_term(glob, prev, mu=2.0, tau=0.5)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    features = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    value = term(None, x, None, None, features)
    expected = 2.0 * contrastive_loss(features, glob.features(x), prev.features(x), 0.5)
    assert torch.allclose(value, expected)
    assert not glob.training and not prev.training  # frozen models use running statistics


# --- equivalences and the previous model --------------------------------------------------------


def test_mu_zero_is_exactly_fedavg():
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    rows, moon = run(tiny_config(algorithm="moon", options={"mu": 0.0}))
    assert_same(moon.server.weights, fedavg.server.weights)
    assert strip_timing(rows) == strip_timing(fed_rows)
    # μ > 0 after the first round: a different model (round 1 is FedAvg for everyone, see below)
    _, pulled = run(tiny_config(algorithm="moon", options={"mu": 5.0}))
    assert distance(pulled.server.weights, fedavg.server.weights) > 1e-3


def test_previous_model_is_stored_and_used_and_defaults_to_the_global():
    config = tiny_config(algorithm="moon", options={"mu": 5.0})
    rt = runtime(config)
    start = rt.workspace.init_weights
    first, state = fit(rt, 1, start)
    assert_same(state["previous"], first.tensors)  # the trained local model is kept

    # first participation: previous = the global model, the term's gradient is zero → FedAvg's step
    plain = _fedavg_fit(rt, 1, start)
    fresh, _ = fit(rt, 1, start)
    assert distance(fresh.tensors, plain) < 1e-5
    with_global, _ = fit(rt, 1, start, {"previous": dict(start)})
    assert distance(with_global.tensors, fresh.tensors) < 1e-6

    # a stored previous model changes the training: it is used
    second, state2 = fit(rt, 1, start, state)
    assert distance(second.tensors, fresh.tensors) > 1e-3
    assert_same(state2["previous"], second.tensors)


def _fedavg_fit(rt, cid: int, start: dict) -> dict:
    """FedAvg's local training, seeded as helpers.fit seeds a client task."""
    seed = derive_seed(rt.config.seed, 1, 0, cid)
    torch.manual_seed(seed)
    ctx = ClientContext(cid, 1, seed, rt.views.at(1)[cid], rt.workspace, rt.options)
    ctx.load(start, role="fedavg")
    ctx.train("fedavg")
    return ctx.weights("fedavg")


# --- options, a run, serial = parallel ----------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("moon.mu=-1", "--set moon.mu: Input should be greater than or equal to 0"),
        ("moon.tau=0", "--set moon.tau: Input should be greater than 0"),
        ("moon.temperature=1", "unknown key; allowed: mu, tau"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("moon", [assignment], needle)


def test_defaults():
    opts = algorithm_options(tiny_config(algorithm="moon"))
    assert opts.mu == 1.0 and opts.tau == 0.5


def test_runs_end_to_end(tmp_path):
    result = run_cli(tmp_path, "moon", "moon.mu=5")
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert 1 / 5 < result.final["global_acc"] <= 1


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="moon", options={"mu": 5.0}))
