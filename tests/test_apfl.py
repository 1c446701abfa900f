"""APFL: the mixed step against hand computation, one client step, α's clipping, what is
uploaded and kept, the personalised evaluation, α = 0 as FedAvg, options, a run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from conftest import tiny_config, tiny_raw

from fedtail.algorithms.apfl import mix, mixed_backward
from fedtail.engine.context import derive_seed
from fedtail.components import algorithm_options, build_config
from helpers import (
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    distance,
    evaluate,
    fit,
    run,
    run_cli,
    runtime,
    softmax_regression_grad,
    strip_timing,
)


# The paper's reading, without the reference code's weight decay, initial v and local-w evaluation:
# the tests that compare with formulas or with FedAvg pin it.
PAPER = {"personal_start": "global", "eval_w": "global"}


def apfl_config(options: dict | None = None, train: dict | None = None, **overrides):
    """A tiny APFL run in the paper's reading (options and train settings override it)."""
    return tiny_config(
        algorithm="apfl", options=PAPER | (options or {}), train={"weight_decay": 0.0} | (train or {}), **overrides
    )


def _noisy(weights: dict, scale: float, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in weights.items()}


def _fedavg_reply(cid: int, start: dict, **train):
    rt = runtime(tiny_config(train=train) if train else tiny_config())
    return fit(rt, cid, start)[0]


# --- the mixed step -----------------------------------------------------------------------------


def test_mixed_step_gives_alpha_times_the_gradient_at_the_mixture_and_the_alpha_derivative():
    torch.manual_seed(0)
    personal = nn.Linear(3, 4).double()
    Wv, bv = personal.weight.detach().clone(), personal.bias.detach().clone()
    Ww, bw = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 4, (6,), generator=g)
    alpha = 0.3
    Wm, bm = alpha * Wv + (1 - alpha) * Ww, alpha * bv + (1 - alpha) * bw  # v̄
    gW, gb = softmax_regression_grad(Wm, bm, x, y)
    loss, grad_alpha = mixed_backward(personal, [Ww, bw], alpha, x, y, adaptive=True)
    assert torch.allclose(loss, F.cross_entropy(x @ Wm.T + bm, y), atol=1e-12)
    assert torch.allclose(personal.weight.grad, alpha * gW, atol=1e-12)  # ∇_v f(v̄) = α ∇f(v̄)
    assert torch.allclose(personal.bias.grad, alpha * gb, atol=1e-12)
    expected = float(((Wv - Ww) * gW).sum() + ((bv - bw) * gb).sum())  # ⟨v − w, ∇f(v̄)⟩
    assert float(grad_alpha) == pytest.approx(expected, abs=1e-12)
    assert abs(expected) > 1e-3
    assert torch.equal(personal.weight.detach(), Wv)  # nothing is stepped here
    personal.zero_grad()
    _, fixed = mixed_backward(personal, [Ww, bw], alpha, x, y, adaptive=False)
    assert fixed is None and torch.allclose(personal.weight.grad, alpha * gW, atol=1e-12)


def test_mix_is_convex_on_floats_and_takes_integer_buffers_from_w():
    v = {"a": torch.tensor([1.0, 3.0]), "n": torch.tensor(7)}
    w = {"a": torch.tensor([5.0, -1.0]), "n": torch.tensor(2)}
    out = mix(v, w, 0.25)
    assert torch.allclose(out["a"], torch.tensor([4.0, 0.0])) and torch.equal(out["n"], torch.tensor(2))
    assert_same(mix(v, w, 0.0), w)


# --- one client step ----------------------------------------------------------------------------


def _reference_step(rt, config, cid, w0, v0, alpha, alpha_lr, mix_w):
    """w, v and α after one APFL step, computed in float64 from the formulas."""
    generator = torch.Generator().manual_seed(derive_seed(config.seed, 1, 0, cid))
    index = rt.views.at(1)[cid].train
    batch = index[torch.randperm(len(index), generator=generator)].split(config.train.batch_size)[0]
    dataset = rt.workspace.dataset
    x, y = dataset.batch(dataset.train, batch)
    x = x.double()
    model = rt.workspace.model("check")

    def loss(params):
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    lr = config.train.lr
    w0 = {k: t.double() for k, t in w0.items()}
    v0 = {k: t.double() for k, t in v0.items()}
    g_w = grad(loss)(w0)
    w1 = {k: w0[k] - lr * g_w[k] for k in w0}
    w_mix = w1 if mix_w == "updated" else w0
    g_bar = grad(loss)({k: alpha * v0[k] + (1 - alpha) * w_mix[k] for k in v0})
    v1 = {k: v0[k] - lr * alpha * g_bar[k] for k in v0}
    grad_alpha = float(sum(((v0[k] - w_mix[k]) * g_bar[k]).sum() for k in v0))
    return w1, v1, min(1.0, max(0.0, alpha - alpha_lr * grad_alpha))


@pytest.mark.parametrize("mix_w", ["updated", "previous"])
def test_one_client_step_equals_the_hand_computed_update_of_w_v_and_alpha(mix_w):
    config = apfl_config(train={"local_steps": 1}, options={"alpha_lr": 1.0, "mix_w": mix_w})
    rt = runtime(config)
    cid, w0 = 2, rt.workspace.init_weights
    v0 = _noisy(w0, 0.05, seed=3)
    answer, state = fit(rt, cid, w0, {"v": v0, "alpha": 0.3})
    w1, v1, alpha1 = _reference_step(rt, config, cid, w0, v0, 0.3, 1.0, mix_w)
    for k in w1:
        assert torch.allclose(answer.tensors[k].double(), w1[k], atol=1e-6), k
        assert torch.allclose(state["v"][k].double(), v1[k], atol=1e-6), k
    assert state["alpha"] == pytest.approx(alpha1, abs=1e-6)
    assert 0 < alpha1 < 0.3 - 1e-3  # α moved, and no clipping was involved
    # the other ordering gives a measurably different v and α, so the test tells them apart
    other = "previous" if mix_w == "updated" else "updated"
    _, v_other, alpha_other = _reference_step(rt, config, cid, w0, v0, 0.3, 1.0, other)
    assert distance(v_other, v1) > 1e-4 and abs(alpha_other - alpha1) > 1e-4
    assert answer.metrics["num_steps"] == 1


# --- α ------------------------------------------------------------------------------------------


def test_alpha_is_clipped_to_the_unit_interval():
    config = apfl_config(options={"alpha_lr": 1e4})  # steps far beyond [0, 1]
    rt = runtime(config)
    start = rt.workspace.init_weights
    alphas = []
    for cid in range(4):
        state = {"v": _noisy(start, 0.3, seed=cid), "alpha": 0.5}
        for _ in range(2):
            _, state = fit(rt, cid, start, state)
            alphas.append(state["alpha"])
    assert all(0.0 <= a <= 1.0 for a in alphas)
    assert any(a in (0.0, 1.0) for a in alphas)  # the clip was needed


def test_fixed_alpha_stays_while_v_learns():
    config = apfl_config(options={"alpha": 0.3, "adaptive": False})
    rt = runtime(config)
    start = rt.workspace.init_weights
    _, state = fit(rt, 1, start)
    assert state["alpha"] == 0.3
    assert distance(state["v"], start) > 1e-3
    _, state = fit(rt, 1, start, state)
    assert state["alpha"] == 0.3


def test_adaptive_alpha_starts_from_the_option_and_moves():
    config = apfl_config(options={"alpha": 0.8})
    rt = runtime(config)
    _, fresh = fit(rt, 3, rt.workspace.init_weights)
    assert fresh["alpha"] != pytest.approx(0.8) and abs(fresh["alpha"] - 0.8) < 0.05  # small steps from the option's α
    first = fresh["alpha"]
    _, later = fit(rt, 3, rt.workspace.init_weights, fresh)  # (the state dict is updated in place)
    assert later["alpha"] != pytest.approx(first) and abs(later["alpha"] - first) < 0.05  # and from the stored α


# --- what leaves the client and what stays ------------------------------------------------------


def test_only_w_is_uploaded_and_it_is_fedavgs_local_model():
    config = apfl_config(options={"alpha_lr": 0.5})
    rt = runtime(config)
    start = _noisy(rt.workspace.init_weights, 0.05, seed=1)
    state = {"v": _noisy(start, 0.2, seed=2), "alpha": 0.6}
    answer, new_state = fit(rt, 4, start, state)
    plain = _fedavg_reply(4, start)
    assert_same(answer.tensors, plain.tensors)  # w_i, trained exactly as FedAvg trains it
    assert answer.metrics == plain.metrics  # no α (nor anything else) among the numbers sent
    assert set(new_state) == {"v", "alpha"}
    assert distance(new_state["v"], answer.tensors) > 1e-2 and new_state["alpha"] != pytest.approx(0.6)


def test_local_eval_w_keeps_the_uploaded_w():
    config = apfl_config(options={"eval_w": "local"})
    rt = runtime(config)
    answer, state = fit(rt, 0, rt.workspace.init_weights)
    assert set(state) == {"v", "alpha", "w"}
    assert_same(state["w"], answer.tensors)


@pytest.mark.parametrize("personal_start", ["global", "initial"])
def test_v_starts_from_the_chosen_model_then_from_the_state(personal_start):
    # α = 0 fixed: v gets no gradient, so it stays where it started
    config = apfl_config(options={"alpha": 0.0, "adaptive": False, "personal_start": personal_start})
    rt = runtime(config)
    glob = _noisy(rt.workspace.init_weights, 0.05, seed=5)
    _, state = fit(rt, 2, glob)
    assert_same(state["v"], glob if personal_start == "global" else rt.workspace.init_weights)
    kept = _noisy(glob, 0.1, seed=6)
    _, state = fit(rt, 2, glob, {"v": kept, "alpha": 0.0})
    assert_same(state["v"], kept)


# --- evaluation ---------------------------------------------------------------------------------


def _plain(cid: int, weights: dict):
    """FedAvg's evaluation: the model in the message."""
    return evaluate(runtime(tiny_config()), cid, weights, {})


def _same_eval(a, b) -> bool:
    return torch.equal(a.tensors["correct"], b.tensors["correct"]) and math.isclose(
        a.metrics["loss_sum"], b.metrics["loss_sum"], rel_tol=1e-6
    )


def test_evaluation_mixes_v_with_the_latest_global_model():
    rt = runtime(apfl_config())
    glob = _noisy(rt.workspace.init_weights, 0.1, seed=7)
    v = _noisy(glob, 0.5, seed=8)
    cid = 3
    assert _same_eval(evaluate(rt, cid, glob, {}), _plain(cid, glob))  # never sampled: the global model
    scored = evaluate(rt, cid, glob, {"v": v, "alpha": 0.4})
    by_hand = {k: 0.4 * v[k] + 0.6 * glob[k] for k in glob}
    assert _same_eval(scored, _plain(cid, by_hand))
    assert not _same_eval(scored, _plain(cid, glob)) and not _same_eval(scored, _plain(cid, v))


def test_local_eval_w_mixes_the_clients_own_w():
    rt = runtime(apfl_config(options={"eval_w": "local"}))
    glob = _noisy(rt.workspace.init_weights, 0.1, seed=7)
    local = _noisy(glob, 0.3, seed=9)
    v = _noisy(glob, 0.5, seed=8)
    scored = evaluate(rt, 1, glob, {"v": v, "alpha": 0.4, "w": local})
    assert _same_eval(scored, _plain(1, {k: 0.4 * v[k] + 0.6 * local[k] for k in glob}))


# --- equivalences with FedAvg -------------------------------------------------------------------


def test_fixed_alpha_zero_is_exactly_fedavg():
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    rows, apfl = run(apfl_config(options={"alpha": 0.0, "adaptive": False}))
    assert_same(apfl.server.weights, fedavg.server.weights)
    assert strip_timing(rows) == strip_timing(fed_rows)


def test_global_model_is_always_fedavgs_and_personalisation_changes_the_rest():
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg"))
    rows, apfl = run(apfl_config())
    assert_same(apfl.server.weights, fedavg.server.weights)
    assert [r["global_acc"] for r in rows] == [r["global_acc"] for r in fed_rows]
    assert [r["personalized_acc"] for r in rows] != pytest.approx([r["personalized_acc"] for r in fed_rows])


# --- options, a run, serial = parallel ----------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("apfl.alpha=1.5", "--set apfl.alpha: Input should be less than or equal to 1"),
        ("apfl.alpha=-0.1", "--set apfl.alpha: Input should be greater than or equal to 0"),
        ("apfl.alpha_lr=0", "--set apfl.alpha_lr: Input should be greater than 0"),
        ("apfl.adaptive=maybe", "--set apfl.adaptive"),
        ("apfl.mix_w=both", "--set apfl.mix_w"),
        ("apfl.eval_w=server", "--set apfl.eval_w"),
        ("apfl.personal_start=random", "--set apfl.personal_start"),
        ("apfl.beta=1", "unknown key; allowed: adaptive, alpha, alpha_lr, eval_w, mix_w, personal_start"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("apfl", [assignment], needle)


def test_defaults_are_the_papers_and_a_run_gets_the_authors_code_settings():
    # the options' defaults: the paper's reading (a stored config without them reads them so)
    bare = algorithm_options(build_config(tiny_raw(algorithm="apfl"), reference=False))
    assert (bare.alpha, bare.adaptive, bare.alpha_lr) == (0.5, True, None)
    assert (bare.mix_w, bare.eval_w, bare.personal_start) == ("updated", "global", "global")
    # a new run gets the reference: FedTorch's weight decay, initial v, evaluation before aggregating
    config = tiny_config(algorithm="apfl")
    opts = algorithm_options(config)
    assert (opts.eval_w, opts.personal_start, opts.alpha, opts.adaptive) == ("local", "initial", 0.5, True)
    assert (config.train.weight_decay, config.train.momentum) == (1e-4, 0.0)
    # what a run sets wins
    mine = tiny_config(algorithm="apfl", options={"eval_w": "global"}, train={"weight_decay": 0.0})
    assert (algorithm_options(mine).eval_w, algorithm_options(mine).personal_start) == ("global", "initial")
    assert mine.train.weight_decay == 0.0


def test_the_reference_run_starts_v_at_w0_and_evaluates_with_the_clients_last_w():
    rt = runtime(tiny_config(algorithm="apfl"))
    glob = _noisy(rt.workspace.init_weights, 0.05, seed=4)
    answer, state = fit(rt, 2, glob)
    assert set(state) == {"v", "alpha", "w"}
    assert_same(state["w"], answer.tensors)
    # one local epoch from w0 (not from the received model): v stays closer to w0 than to glob
    assert distance(state["v"], rt.workspace.init_weights) < distance(state["v"], glob)
    later = _noisy(glob, 0.2, seed=11)  # a newer global model does not enter the evaluation
    scored = evaluate(rt, 2, later, state)
    by_hand = mix(state["v"], state["w"], state["alpha"])
    assert _same_eval(scored, _plain(2, by_hand))
    # a client state from before (no w) is evaluated with the message's w, not a KeyError
    old = {"v": state["v"], "alpha": state["alpha"]}
    assert _same_eval(evaluate(rt, 2, later, old), _plain(2, mix(state["v"], later, state["alpha"])))


def test_runs_end_to_end(tmp_path):
    result = run_cli(tmp_path, "apfl", "apfl.alpha=0.25")
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert 1 / 5 < result.final["global_acc"] <= 1


def test_serial_and_parallel_agree():
    config = tiny_config(algorithm="apfl", rounds=2, options={"eval_w": "local", "mix_w": "previous"})
    assert_serial_and_parallel_agree(config)
