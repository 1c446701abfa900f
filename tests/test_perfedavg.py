"""Per-FedAvg: the FO and HF meta steps against hand computation, the local schedules (epochs,
PFLlib's), β = lr, the reference settings, adaptation before evaluation, a run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from conftest import tiny_config
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.algorithms.perfedavg import PerFedAvgConfig, meta_gradient, shuffled_batches
from fedtail.engine.context import ClientContext, derive_seed
from fedtail.components import algorithm_options
from helpers import (
    assert_config_error,
    assert_serial_and_parallel_agree,
    evaluate,
    fit,
    run_cli,
    runtime,
    set_finetune,
    set_options,
    softmax_regression_grad,
)

EVAL_CALL = 1 << 20  # helpers.evaluate's call index


def _batches(seed: int, sizes=(5, 6, 4), dim: int = 3, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, dim, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g))
        for n in sizes
    ]


# --- the meta step ------------------------------------------------------------------------------


def test_first_order_step_equals_the_two_step_formula():
    torch.manual_seed(0)
    model = nn.Linear(3, 4).double()
    W, b = model.weight.detach().clone(), model.bias.detach().clone()
    D, D2, _ = _batches(1)
    alpha = 0.3
    gW, gb = softmax_regression_grad(W, b, *D)
    W_adapted, b_adapted = W - alpha * gW, b - alpha * gb  # w̃ = w − α∇f(w; D)
    expected = softmax_regression_grad(W_adapted, b_adapted, *D2)  # ∇f(w̃; D')
    direction, losses = meta_gradient(model, [D, D2], alpha, hessian=False)
    assert len(direction) == 2 and len(losses) == 2
    for got, want in zip(direction, expected):
        assert torch.allclose(got, want, atol=1e-12)
    assert torch.equal(model.weight.detach(), W)  # the model itself is not changed
    # α = 0: the gradient at w on D'
    plain, _ = meta_gradient(model, [D, D2], 0.0, hessian=False)
    assert torch.allclose(plain[0], softmax_regression_grad(W, b, *D2)[0], atol=1e-12)


def test_hessian_free_step_equals_the_explicit_hessian_correction():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4)).double()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    D, D2, D3 = _batches(2)
    alpha = 0.2

    def loss(flat, batch):
        x, y = batch
        params = dict(zip(names, [c.reshape(s) for c, s in zip(flat.split([s.numel() for s in shapes]), shapes)]))
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    g = torch.autograd.functional.jacobian(lambda t: loss(t, D), theta)
    g_adapted = torch.autograd.functional.jacobian(lambda t: loss(t, D2), theta - alpha * g)
    H = torch.autograd.functional.hessian(lambda t: loss(t, D3), theta)  # the whole Hessian at w on D''
    expected = g_adapted - alpha * H @ g_adapted
    direction, losses = meta_gradient(model, [D, D2, D3], alpha, hessian=True)
    got = torch.cat([d.reshape(-1) for d in direction])
    assert len(losses) == 3
    assert torch.allclose(got, expected, atol=1e-10)
    assert not torch.allclose(got, g_adapted, atol=1e-4)  # the correction matters here
    fo, _ = meta_gradient(model, [D, D2], alpha, hessian=False)
    assert torch.allclose(torch.cat([d.reshape(-1) for d in fo]), g_adapted, atol=1e-10)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_client_takes_beta_steps_along_the_meta_gradient(variant):
    config = tiny_config(
        algorithm="perfedavg", train={"local_steps": 1}, options={"variant": variant, "beta": 0.1, "steps": "epochs"}
    )
    rt = runtime(config)
    cid, start = 3, rt.workspace.init_weights
    answer, state = fit(rt, cid, start)
    # the same batches the client drew: its task's stream, k consecutive batches
    k = 2 if variant == "fo" else 3
    generator = torch.Generator().manual_seed(derive_seed(config.seed, 1, 0, cid))
    stream = shuffled_batches(rt.views.at(1)[cid].train, config.train.batch_size, generator)
    dataset = rt.workspace.dataset
    batches = [dataset.batch(dataset.train, next(stream)) for _ in range(k)]
    model = rt.workspace.model("check")
    model.load_state_dict(start)
    direction, _ = meta_gradient(model, batches, config.train.lr, hessian=variant == "hf")  # α = the run's lr
    for (name, p), d in zip(model.named_parameters(), direction):
        assert torch.allclose(answer.tensors[name], p.detach() - 0.1 * d, atol=1e-7), name
    assert answer.metrics["num_steps"] == 1
    assert answer.metrics["num_samples"] == sum(len(y) for _, y in batches)
    assert state == {}


def test_local_steps_share_out_the_epochs_batches():
    config = tiny_config(algorithm="perfedavg", train={"local_epochs": 2}, options={"steps": "epochs"})
    rt = runtime(config)
    for cid in range(3):
        n = len(rt.views.at(1)[cid].train)
        per_epoch = -(-n // config.train.batch_size)
        for variant, k in (("fo", 2), ("hf", 3)):
            set_options(rt, config, variant=variant, steps="epochs")
            answer, _ = fit(rt, cid, rt.workspace.init_weights)
            assert answer.metrics["num_steps"] == max(1, 2 * per_epoch // k)


def test_pfllib_steps_take_two_passes_of_full_chunks():
    # PFLlib: each epoch cut into k·B-sample chunks (last incomplete one dropped), one step per
    # chunk split into k disjoint batches of B, the E epochs run twice a round.
    config = tiny_config(algorithm="perfedavg", train={"local_epochs": 2, "batch_size": 8}, options={"steps": "pfllib"})
    rt = runtime(config)
    B, E = config.train.batch_size, config.train.local_epochs
    checked = 0
    for cid in range(config.partition.num_clients):
        n = len(rt.views.at(1)[cid].train)
        for variant, k in (("fo", 2), ("hf", 3)):
            set_options(rt, config, variant=variant, steps="pfllib")
            answer, _ = fit(rt, cid, rt.workspace.init_weights)
            chunks = n // (k * B)
            assert answer.metrics["num_steps"] == 2 * E * max(1, chunks)
            if chunks:  # every step reads k full batches: B samples each
                assert answer.metrics["num_samples"] == answer.metrics["num_steps"] * k * B
                checked += 1
    assert checked  # some client holds at least one full chunk (the batches read are checked below)


def step_batches_of(index, size, generator, k):
    """What the pfllib rule's first step reads: the first ``size`` of a permutation, in k parts."""
    order = index[torch.randperm(len(index), generator=generator)]
    return torch.tensor_split(order[:size], k)


def test_null_beta_is_the_runs_learning_rate():
    config = tiny_config(algorithm="perfedavg", train={"local_steps": 1}, options={"beta": None, "steps": "pfllib"})
    rt = runtime(config)
    cid, start = 3, rt.workspace.init_weights
    answer, _ = fit(rt, cid, start)
    generator = torch.Generator().manual_seed(derive_seed(config.seed, 1, 0, cid))
    dataset = rt.workspace.dataset
    parts = step_batches_of(rt.views.at(1)[cid].train, 2 * config.train.batch_size, generator, 2)
    batches = [dataset.batch(dataset.train, part) for part in parts]
    model = rt.workspace.model("check")
    model.load_state_dict(start)
    direction, _ = meta_gradient(model, batches, config.train.lr, hessian=False)
    for (name, p), d in zip(model.named_parameters(), direction):  # β = α = the run's lr
        assert torch.allclose(answer.tensors[name], p.detach() - config.train.lr * d, atol=1e-7), name
    moved = max(float((answer.tensors[n] - start[n]).abs().max()) for n, _ in model.named_parameters())
    assert moved > 1e-4  # the step is not negligible, so the comparison above could fail


# --- evaluation ---------------------------------------------------------------------------------


def _plain_evaluate(rt, cid: int, weights: dict) -> Message:
    ctx = ClientContext(cid, 1, 0, rt.views.at(1)[cid], rt.workspace, rt.options)
    return ClientHalf().evaluate(Message("evaluate", weights), ctx)


def test_evaluation_adapts_with_plain_sgd_steps_of_alpha():
    config = tiny_config(algorithm="perfedavg", finetune={"steps": None})
    assert not config.finetune.active
    rt = runtime(config)
    glob = {k: v + 0.02 for k, v in rt.workspace.init_weights.items()}
    for cid in range(3):  # no steps: the global model
        scored = evaluate(rt, cid, glob, {})
        plain = _plain_evaluate(rt, cid, glob)
        assert torch.equal(scored.tensors["correct"], plain.tensors["correct"])
        assert scored.metrics["loss_sum"] == plain.metrics["loss_sum"]
    set_finetune(rt, steps=1, optimizer="plain")
    set_options(rt, config, alpha=0.5)
    cid = 4
    scored = evaluate(rt, cid, glob, {})
    # one step w − α∇f(w; B) on the first batch of the evaluation task's stream
    generator = torch.Generator().manual_seed(derive_seed(config.seed, 1, EVAL_CALL, cid))
    index = next(shuffled_batches(rt.views.at(1)[cid].train, config.train.batch_size, generator))
    x, y = rt.workspace.dataset.batch(rt.workspace.dataset.train, index)
    model = rt.workspace.model("check")
    model.load_state_dict(glob)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    adapted = {name: (p - 0.5 * p.grad).detach() for name, p in model.named_parameters()}
    expected = _plain_evaluate(rt, cid, adapted)
    assert torch.equal(scored.tensors["correct"], expected.tensors["correct"])
    assert scored.metrics["loss_sum"] == pytest.approx(expected.metrics["loss_sum"], rel=1e-5)
    assert scored.metrics["loss_sum"] != pytest.approx(_plain_evaluate(rt, cid, glob).metrics["loss_sum"])
    assert evaluate(rt, cid, glob, {}).metrics["loss_sum"] == scored.metrics["loss_sum"]  # deterministic


# --- options, a run, serial = parallel ----------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("perfedavg.variant=so", "--set perfedavg.variant"),
        ("perfedavg.alpha=0", "--set perfedavg.alpha: Input should be greater than 0"),
        ("perfedavg.beta=-0.1", "--set perfedavg.beta: Input should be greater than 0"),
        ("finetune.steps=0", "--finetune-steps: Input should be greater than or equal to 1"),
        ("perfedavg.steps=tau", "--set perfedavg.steps"),
        ("perfedavg.delta=0.001", "unknown key; allowed: alpha, beta, steps, variant"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("perfedavg", [assignment], needle)


def test_defaults_and_reference_settings():
    # the option defaults: what a stored config without the keys means (runs before the reference)
    opts = PerFedAvgConfig()
    assert (opts.variant, opts.alpha, opts.beta, opts.steps) == ("fo", None, 0.001, "epochs")
    # a run built from flags or files gets PFLlib's β = lr and its step rule, written into its options
    config = tiny_config(algorithm="perfedavg")
    assert (config.options["beta"], config.options["steps"]) == (None, "pfllib")
    # the other options are written out with their defaults
    assert config.model_dump(mode="json")["options"] == {"variant": "fo", "alpha": None, "beta": None, "steps": "pfllib"}
    # and the adaptation before evaluation: one plain SGD step (the engine's fine-tuning)
    assert (config.finetune.steps, config.finetune.optimizer, config.finetune.lr) == (1, "plain", None)
    assert (config.train.momentum, config.train.grad_clip) == (0.0, None)
    # the paper's β and the old step rule stay options; a set key is kept
    paper = algorithm_options(tiny_config(algorithm="perfedavg", options={"beta": 0.001, "steps": "epochs"}))
    assert (paper.beta, paper.steps) == (0.001, "epochs")


def test_configs_stored_with_eval_steps_read_as_the_engine_setting():
    from fedtail.config import RunConfig
    from fedtail.report.runfiles import config_diff

    today = tiny_config(algorithm="perfedavg").model_dump(mode="json")
    old = {**{k: v for k, v in today.items() if k != "finetune"}, "options": {**today["options"], "eval_steps": 1}}
    assert config_diff(old, today) == []
    assert RunConfig.model_validate(old).finetune == RunConfig.model_validate(today).finetune
    none = {**old, "options": {**today["options"], "eval_steps": 0}}
    assert not RunConfig.model_validate(none).finetune.active


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_runs_end_to_end(tmp_path, variant):
    result = run_cli(tmp_path, "perfedavg", f"perfedavg.variant={variant}", "perfedavg.beta=0.05")
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert 1 / 5 < result.final["global_acc"] <= 1


def test_serial_and_parallel_agree():
    config = tiny_config(algorithm="perfedavg", rounds=2, options={"variant": "hf", "beta": 0.05})
    assert_serial_and_parallel_agree(config)
