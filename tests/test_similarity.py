"""The clients' pairwise similarity of data and models (FedAC's Fig. 2): metrics, logging, report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import entropy
from sklearn.decomposition import PCA

from conftest import tiny_config
from fedtail.errors import ConfigError
from fedtail.metrics.similarity import client_similarity, label_kl, lrcos, centred_gram, model_distances
from helpers import run


def test_label_kl_is_scipy_entropy_of_the_smoothed_frequencies():
    counts = np.array([[5, 0, 3], [1, 4, 0], [2, 2, 2]])
    kl = label_kl(counts)
    p = (counts + 1.0) / (counts + 1.0).sum(axis=1, keepdims=True)
    for i in range(3):
        for j in range(3):
            assert kl[i, j] == pytest.approx(entropy(p[i], p[j]), abs=1e-12)
    assert np.allclose(np.diag(kl), 0)
    assert kl[0, 1] != pytest.approx(kl[1, 0])  # KL is not symmetric


def test_distances_and_lrcos_match_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    models = torch.randn(7, 40, generator=g, dtype=torch.float64)
    gram = centred_gram(models)
    assert np.allclose(model_distances(gram), torch.cdist(models, models).numpy(), atol=1e-9)
    cos, kept = lrcos(gram, dims=3)
    scores = PCA(n_components=3).fit_transform(models.numpy())  # centred, as FedAC's pca_center
    unit = scores / np.linalg.norm(scores, axis=1, keepdims=True)
    assert kept == 3 and np.allclose(cos, unit @ unit.T, atol=1e-9)
    # D is capped at n - 1: n centred points span at most n - 1 directions
    assert lrcos(gram, dims=50)[1] == 6


def test_agreement_is_one_when_a_measure_orders_pairs_as_the_data():
    counts = np.array([[9, 1, 0], [8, 2, 0], [0, 1, 9], [1, 0, 9]])
    p = (counts + 1.0) / (counts + 1.0).sum(axis=1, keepdims=True)
    models = torch.tensor(np.log(p))  # models that are a function of the label distribution
    rec = client_similarity(models, counts)
    assert rec["spearman_kl"]["l2"] > 0.8 and rec["spearman_kl"]["lrcos"] > 0.5
    same = client_similarity(torch.ones(4, 5, dtype=torch.float64), counts)  # identical models: undefined
    assert same["spearman_kl"] == {"l2": None, "lrcos": None}


def test_a_run_logs_the_matrices_of_the_evaluated_models_at_the_chosen_rounds(tmp_path):
    rows, sim = run(tiny_config(rounds=3, similarity_rounds=[2], finetune={"epochs": 1}))
    logged = {r["round"]: r for r in rows if "client_similarity" in r}
    assert list(logged) == [2]
    rec = logged[2]["client_similarity"]
    n = sim.num_clients
    assert rec["clients"] == list(range(n))
    for name in ("kl", "l2", "lrcos"):
        m = np.array(rec[name])
        assert m.shape == (n, n) and np.isfinite(m).all()
    assert np.allclose(np.diag(rec["l2"]), 0) and np.allclose(np.diag(rec["lrcos"]), 1)
    assert np.allclose(rec["l2"], np.array(rec["l2"]).T)
    # the evaluated models' tensors are in the log only as these matrices
    assert all("evaluated_model" not in str(list(r)) for r in rows)
    # and logging them changes nothing else
    plain, _ = run(tiny_config(rounds=3, finetune={"epochs": 1}))
    strip = lambda r: {k: v for k, v in r.items() if k not in ("client_similarity", "elapsed_s")}  # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in plain]


def test_a_round_that_is_not_evaluated_is_refused():
    with pytest.raises(ConfigError, match="--similarity-rounds 3: not an evaluated round"):
        tiny_config(rounds=4, eval_every=2, similarity_rounds=[3])


def test_the_report_draws_fig_2(tmp_path):
    from fedtail.report.plots import plot_client_similarity

    rows, sim = run(tiny_config(rounds=2, similarity_rounds=[2], finetune={"epochs": 1}))
    counts = np.ones((sim.num_clients, 10))
    assert plot_client_similarity(rows, tmp_path / "fig2.png", counts)
    assert (tmp_path / "fig2.png").stat().st_size > 1000
    assert not plot_client_similarity(rows[:0], tmp_path / "none.png")


# --- MuPFL's Fig. 3(b): the global model's prediction probabilities of each class -----------------


def test_class_probabilities_are_mean_softmax_rows_and_change_nothing_else(tmp_path):
    from fedtail.report.plots import plot_class_probabilities

    rows, sim = run(tiny_config(rounds=2, class_probabilities=True))
    plain, _ = run(tiny_config(rounds=2))
    row = rows[-1]
    matrix = np.array(row["global_class_probabilities"], dtype=float)
    C = sim.dataset.num_classes
    assert matrix.shape == (C, C) and np.allclose(matrix.sum(axis=1), 1, atol=1e-5)
    assert 0 < row["global_prediction_entropy"] <= np.log(C) + 1e-9
    # the same numbers from the model directly
    model = sim.workspace.model("check")
    model.load_state_dict(sim.server.global_weights())
    model.eval()
    with torch.inference_mode():
        x, y = sim.dataset.test.x, sim.dataset.test.y
        p = torch.softmax(model(x).double(), dim=1)
    expected = np.stack([p[y == c].mean(0).numpy() for c in range(C)])
    assert np.allclose(matrix, expected, atol=1e-5)
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("global_class") and k not in ("global_prediction_entropy", "elapsed_s")}  # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in plain]
    assert plot_class_probabilities(rows, tmp_path / "p.png") and not plot_class_probabilities(plain, tmp_path / "q.png")
