"""MuPFL's three mechanisms (BAVD, ACMU, PKCF wiring) and the algorithm end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_config
from fedtail.algorithms.mupfl import MuPFLConfig
from fedtail.algorithms.mupfl.acmu import cluster_clients, cluster_update, embedding, similarity
from fedtail.algorithms.mupfl.bavd import ActivationMaps, keep_mask, threshold, value_mask
from fedtail.models import build_model
from helpers import run, run_with_summary

FAST = {"num_features": 4, "tau": 2, "match_iterations": 5}


def mupfl_config(**options):
    return tiny_config(algorithm="mupfl", options=FAST | options, rounds=3)


# --- BAVD ------------------------------------------------------------------------------------


def _cnn():
    torch.manual_seed(0)
    return build_model("cnn-fmnist", (1, 8, 8), 3)


def test_bavd_zeroes_exactly_the_positions_below_the_threshold_in_training():
    model = _cnn()
    x = torch.randn(5, 1, 8, 8)
    maps = ActivationMaps([0], psi_sign=1.0)
    planted = torch.rand(32, 8, 8)
    maps.maps[0] = planted.clone()
    first_relu = model.body[1]
    captured = {}
    first_relu.register_forward_hook(lambda m, i, o: captured.__setitem__("plain", o.clone()))
    model.train()
    with maps.attached(model):
        masked_out = model.body[:2](x)  # conv -> ReLU(+BAVD)
    normalised = (planted - planted.min()) / (planted.max() - planted.min())
    keep = normalised >= normalised.mean()
    assert 0 < keep.sum() < keep.numel()  # the test plants a map that drops some positions
    assert torch.equal(masked_out, captured["plain"] * keep)
    assert torch.all(masked_out[:, ~keep] == 0)
    assert torch.equal(keep_mask(planted), keep)


def test_bavd_is_the_identity_in_evaluation_and_after_detaching():
    model = _cnn()
    x = torch.randn(4, 1, 8, 8)
    model.eval()
    expected = model(x)
    maps = ActivationMaps([0, 1], psi_sign=1.0)
    maps.maps = [torch.rand(32, 8, 8), torch.rand(64, 4, 4)]
    with maps.attached(model):
        assert torch.equal(model(x), expected)  # eval mode: identity
        model.train()
        assert not torch.equal(model(x), expected)  # training: masked
        model.eval()
    model.train()
    trained_plain = model(x)
    model.eval()
    assert torch.equal(model.eval()(x), expected)
    assert trained_plain.shape == expected.shape


def test_bavd_map_follows_equation_6_and_the_sign_option():
    h0, h1 = torch.rand(2, 3), torch.rand(2, 3)
    for sign in (1.0, -1.0):
        maps = ActivationMaps([0], psi_sign=sign)
        maps._batch_means[0] = h0
        maps.on_step(2.0)  # λ = 0: M = h0
        assert torch.equal(maps.maps[0], h0)
        maps._batch_means[0] = h1
        maps.on_step(1.5)  # λ = 1: M = h0 + sign·(1.5 − 2.0)·h1
        assert torch.allclose(maps.maps[0], h0 + sign * (1.5 - 2.0) * h1)
        assert maps.last_loss == 1.5


def test_bavd_rejects_layers_the_body_does_not_have():
    maps = ActivationMaps([5], psi_sign=1.0)
    with pytest.raises(ValueError, match="activation layers"):
        with maps.attached(_cnn()):
            pass


# --- ACMU ------------------------------------------------------------------------------------


def test_embedding_distance_is_the_papers_similarity():
    g = torch.Generator().manual_seed(1)
    deltas, maps = torch.randn(6, 20, generator=g), torch.rand(6, 9, generator=g)
    alpha = 0.3
    points = embedding(deltas, maps, alpha)
    cos = nn.functional.cosine_similarity
    for i in range(6):
        for j in range(6):
            dist = alpha * cos(deltas[i], deltas[j], dim=0) + (1 - alpha) * cos(maps[i], maps[j], dim=0)
            assert similarity(points)[i, j] == pytest.approx(float(dist), abs=1e-6)
            assert np.sum((points[i] - points[j]) ** 2) == pytest.approx(2 * (1 - float(dist)), abs=1e-6)


def test_acmu_finds_planted_clusters_and_their_number():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 50)) * 5
    truth = np.repeat([0, 1, 2], 4)
    deltas = torch.tensor(centres[truth] + rng.normal(size=(12, 50)) * 0.3)
    found = cluster_clients(embedding(deltas, None, 1.0), kappa=None, kappa_min=2, kappa_max=6, seed=0)
    assert found.kappa == 3
    assert set(found.scores) == {2, 3, 4, 5, 6}
    # Same partition up to label names.
    for label in range(3):
        assert len(set(found.labels[truth == label])) == 1
    assert len(set(found.labels)) == 3


def test_acmu_fixed_kappa_and_small_edges():
    deltas = torch.randn(5, 10, generator=torch.Generator().manual_seed(0))
    assert cluster_clients(embedding(deltas, None, 1.0), kappa=4, kappa_min=2, kappa_max=6, seed=0).kappa == 4
    two = cluster_clients(embedding(deltas[:2], None, 1.0), kappa=None, kappa_min=2, kappa_max=6, seed=0)
    assert list(two.labels) == [0, 1]  # no silhouette with 2 clients: each keeps its own update


def test_in_cluster_update_is_equation_14():
    starts = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([5.0, 5.0])}]
    deltas = [{"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([3.0, -1.0])}, {"w": torch.tensor([0.5, 0.5])}]
    weights = [{"w": s["w"] + d["w"]} for s, d in zip(starts, deltas)]
    out = cluster_update(weights, deltas, np.array([0, 0, 1]))
    cluster_mean = torch.tensor([2.0, 0.0])
    assert torch.allclose(out[0]["w"], starts[0]["w"] + cluster_mean)
    assert torch.allclose(out[1]["w"], starts[1]["w"] + cluster_mean)
    assert torch.allclose(out[2]["w"], weights[2]["w"])  # a singleton keeps its own update


# --- the algorithm end to end ------------------------------------------------------------------


def test_mupfl_runs_logs_clusters_and_is_deterministic():
    config = mupfl_config()
    summary, rows, _ = run_with_summary(config)
    summary2, rows2, _ = run_with_summary(config)
    assert rows[-1]["per_client_acc"] == rows2[-1]["per_client_acc"]
    assert summary["final"]["personalized_acc"] > 0.3  # 5 classes: chance is 0.2
    log = rows[-1]["rounds_log"][-1]
    (record,) = log["acmu"]
    assert 2 <= record["kappa"] <= 6 or record["kappa"] == len(record["clients"])
    assert len(record["clusters"]) == len(record["clients"]) == config.clients_per_round
    assert len(record["pca"]) == len(record["clients"])
    before, after = log["pkcf_match"]
    assert after <= before


def test_fixed_kappa_is_recorded():
    rows, _ = run(tiny_config(algorithm="mupfl", options=FAST | {"kappa": 2}, rounds=2, fraction=1.0))
    assert all(r["acmu"][0]["kappa"] == 2 for row in rows for r in row["rounds_log"])


@pytest.mark.parametrize("switch", ["bavd", "acmu", "pkcf"])
def test_each_ablation_switch_changes_the_result(switch):
    full, sim_full = run(mupfl_config())
    ablated, sim_off = run(mupfl_config(**{switch: False}))
    assert full[-1]["per_client_acc"] != ablated[-1]["per_client_acc"]
    w_full, w_off = sim_full.server.global_weights(), sim_off.server.global_weights()
    assert any(not torch.equal(w_full[k], w_off[k]) for k in w_full)
    state = next(iter(sim_off.client_state.values()))
    assert ("bavd" in state) == (switch != "bavd")
    if switch == "pkcf":
        assert "features" not in sim_off.server.state_dict()


def test_clients_keep_personal_models_and_edges_see_every_client():
    config = tiny_config(algorithm="mupfl", options=FAST, rounds=2, fraction=1.0, edges=2)
    rows, sim = run(config)
    assert all("personal" in s for s in sim.client_state.values())
    records = rows[-1]["rounds_log"][-1]["acmu"]
    assert sorted(c for r in records for c in r["clients"]) == list(range(config.partition.num_clients))
    assert [r["edge"] for r in records] == [0, 1]


def test_options_are_validated():
    with pytest.raises(ValueError, match="kappa_min"):
        MuPFLConfig(kappa_min=5, kappa_max=3)
    with pytest.raises(ValueError):
        MuPFLConfig(alpha=1.5)


def test_bavd_rescale_divides_kept_activations_by_the_kept_fraction():
    model = _cnn()
    x = torch.randn(3, 1, 8, 8)
    planted = torch.rand(32, 8, 8)
    keep = keep_mask(planted)
    outs = {}
    for rescale in (False, True):
        maps = ActivationMaps([0], psi_sign=-1.0, rescale=rescale)
        maps.maps[0] = planted.clone()
        model.train()
        with maps.attached(model):
            outs[rescale] = model.body[:2](x)
    assert torch.allclose(outs[True], outs[False] / keep.float().mean())


def test_negative_layer_index_selects_the_last_activation():
    model = _cnn()
    maps = ActivationMaps([-1], psi_sign=1.0)
    model.train()
    with maps.attached(model):
        model(torch.randn(2, 1, 8, 8))
        maps.on_step(1.0)
    assert maps.maps[0].shape == (64, 4, 4)  # the second conv block's activation


# --- BAVD readings (issue 16) ----------------------------------------------------------------


def test_value_mask_keeps_each_slices_own_highest_activations():
    # Two samples, one channel, 2×2: the same map threshold, different positions kept per sample.
    h = torch.tensor([[[[0.0, 1.0], [2.0, 4.0]]], [[[4.0, 3.0], [0.0, 0.0]]]])
    maps = ActivationMaps([0], psi_sign=-1.0, mask="value")
    mu = 0.5
    keep = value_mask(h, mu)
    # sample 0 normalised: 0, .25, .5, 1 -> keeps 2 and 4; sample 1: 1, .75, 0, 0 -> keeps 4 and 3
    assert keep.tolist() == [[[[False, False], [True, True]]], [[[True, True], [False, False]]]]
    planted = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # normalised mean 0.5
    assert threshold(planted) == pytest.approx(0.5)
    assert torch.equal(maps._keep(h, planted), keep)
    flat = torch.zeros(1, 1, 2, 2)
    assert value_mask(flat, mu).all()  # a flat slice carries no preference


def test_value_mask_in_a_training_pass():
    model = _cnn()
    x = torch.randn(4, 1, 8, 8)
    planted = torch.rand(32, 8, 8)
    captured = {}
    model.body[1].register_forward_hook(lambda m, i, o: captured.__setitem__("plain", o.clone()))
    maps = ActivationMaps([0], psi_sign=-1.0, mask="value")
    maps.maps[0] = planted.clone()
    model.train()
    with maps.attached(model):
        out = model.body[:2](x)
    keep = value_mask(captured["plain"], threshold(planted))
    assert 0 < keep.float().mean() < 1
    assert torch.equal(out, captured["plain"] * keep)
    # Input-dependent: the kept positions differ between samples, unlike the map mask.
    assert not torch.equal(keep[0], keep[1])


def test_batch_map_masks_from_the_current_batch_from_the_first_step():
    model = _cnn()
    x = torch.randn(6, 1, 8, 8)
    captured = {}
    model.body[1].register_forward_hook(lambda m, i, o: captured.__setitem__("plain", o.clone()))
    model.train()
    accumulated = ActivationMaps([0], psi_sign=-1.0)
    with accumulated.attached(model):
        first = model.body[:2](x)
    assert torch.equal(first, captured["plain"])  # λ = 0 of an accumulated map: nothing dropped
    batch = ActivationMaps([0], psi_sign=-1.0, source="batch")
    batch.maps[0] = torch.rand(32, 8, 8)  # an accumulated map that the batch reading ignores
    with batch.attached(model):
        out = model.body[:2](x)
    keep = keep_mask(captured["plain"].mean(0))
    assert 0 < keep.float().mean() < 1
    assert torch.equal(out, captured["plain"] * keep)


def test_hw_maps_drop_whole_positions_across_channels():
    model = _cnn()
    x = torch.randn(3, 1, 8, 8)
    maps = ActivationMaps([0], psi_sign=-1.0, shape="hw")
    model.train()
    with maps.attached(model):
        model.body[:2](x)
        maps.on_step(1.0)
    assert maps.maps[0].shape == (8, 8)  # H×W, as the paper types M
    captured = {}
    handle = model.body[1].register_forward_hook(lambda m, i, o: captured.__setitem__("plain", o.clone()))
    with maps.attached(model):
        out = model.body[:2](x)
    handle.remove()
    keep = keep_mask(maps.maps[0])
    assert 0 < keep.float().mean() < 1
    assert torch.equal(out, captured["plain"] * keep)  # the same H×W mask in every channel
