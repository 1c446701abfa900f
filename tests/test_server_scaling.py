"""Issue 21: the servers' exact n-coordinate formulations equal the d-dimensional ones they replace.

References are computed here, with scikit-learn / torch on the raw vectors (the former code).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.cluster import AgglomerativeClustering, KMeans, kmeans_plusplus
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score

from fedtail.algorithms import clustering
from fedtail.algorithms.cgpfl import kmeans_labels
from fedtail.algorithms.clustering import (
    centred_gram,
    cosine_matrix,
    gram,
    gram_coordinates,
    kmeans,
    project_2d,
    row_mean,
    squared_distances,
)
from fedtail.algorithms.fesem import seeded_centres
from fedtail.algorithms.flhc import hierarchical_clusters
from helpers import same_partition


def planted(groups: int = 4, per_group: int = 6, dim: int = 3000, spread: float = 0.8, offset: float = 0.0, seed: int = 0):
    """float32 rows around random centres (plus a shared ``offset``, as models share one); their groups."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(groups), per_group)
    rows = rng.normal(size=(groups, dim))[truth] + spread * rng.normal(size=(len(truth), dim)) + offset
    return torch.tensor(rows, dtype=torch.float32), truth


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few hundred values, so every blockwise pass crosses block boundaries."""
    monkeypatch.setattr(clustering, "BLOCK_VALUES", 777)


def test_gram_coordinates_keep_every_inner_product_and_distance(small_blocks):
    rows, _ = planted(dim=500, offset=3.0)
    x = rows.double()
    g = gram(rows)
    np.testing.assert_allclose(g, (x @ x.T).numpy(), rtol=1e-5)
    y = gram_coordinates(g)
    assert y.shape[1] <= len(rows)
    np.testing.assert_allclose(y @ y.T, (x @ x.T).numpy(), rtol=1e-5, atol=1e-6 * float(x.pow(2).sum(1).max()))
    # centred: the distances, without the offset's rounding
    c = x - x.mean(0)
    yc = gram_coordinates(centred_gram(rows))
    d_ref = torch.cdist(c, c).pow(2).numpy()
    d_new = ((yc[:, None, :] - yc[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(d_new, d_ref, rtol=1e-5, atol=1e-6 * d_ref.max())
    assert torch.allclose(row_mean(rows), x.mean(0), atol=1e-12)


def test_gram_coordinates_of_identical_rows_are_one_zero_column():
    assert np.array_equal(gram_coordinates(centred_gram(torch.ones(4, 30))), np.zeros((4, 1)))


def test_kmeans_on_gram_coordinates_has_the_partition_and_inertia_of_kmeans_on_the_vectors():
    rows, truth = planted(groups=5, per_group=8, dim=4000, spread=1.0, seed=1)
    x = rows.double().numpy()
    y = gram_coordinates(centred_gram(rows))
    for k in (2, 3, 5, 7):
        ref = KMeans(n_clusters=k, n_init=10, random_state=3).fit(x)
        ours = kmeans(y, k, 3, n_init=10, dim=x.shape[1])
        # the same partition (its label numbering may differ where restarts tie within rounding: clustering.kmeans)
        assert adjusted_rand_score(ref.labels_, ours.labels_) == pytest.approx(1.0)
        assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-5)


def test_project_2d_is_the_pca_of_the_vectors_up_to_each_axis_sign(small_blocks):
    rows, _ = planted(dim=800, offset=2.0, seed=2)
    ref = PCA(n_components=2).fit_transform(rows.double().numpy())
    view = np.array(project_2d(rows))
    for axis in range(2):
        sign = np.sign(view[:, axis] @ ref[:, axis])
        np.testing.assert_allclose(view[:, axis], sign * ref[:, axis], atol=1e-4)
        assert view[np.argmax(np.abs(view[:, axis])), axis] > 0  # orientation: largest score positive
    # few coordinates: exact float64 route; one row or a line: zeros where there is no variance
    assert project_2d(torch.zeros(1, 5)) == [[0.0, 0.0]]
    line = project_2d(torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [3.0, 3.0, 0.0]]))
    assert [p[1] for p in line] == [0.0, 0.0, 0.0] and line[2][0] > 0


def test_blockwise_distances_and_cosines_equal_the_float64_ones(small_blocks):
    rows, _ = planted(dim=300, offset=50.0, seed=4)  # rows close together relative to their norm
    centres = rows[:3] + 0.01
    ref = torch.cdist(rows.double(), centres.double(), compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    np.testing.assert_allclose(squared_distances(rows, centres).numpy(), ref.numpy(), rtol=1e-9, atol=1e-9)
    a, b = rows.double(), centres.double()
    cos = (a / a.norm(dim=1, keepdim=True)) @ (b / b.norm(dim=1, keepdim=True)).T
    np.testing.assert_allclose(cosine_matrix(rows, centres).numpy(), cos.numpy(), atol=1e-12)


def test_fesem_seeding_picks_the_rows_kmeans_plusplus_picks_on_the_vectors():
    rows, _ = planted(groups=6, per_group=5, dim=2500, offset=4.0, seed=5)
    for seed in (0, 1, 2):
        _, picked = kmeans_plusplus(rows.double().numpy(), n_clusters=4, random_state=seed)
        assert torch.equal(seeded_centres(rows, 4, seed), rows[torch.as_tensor(picked)])


@pytest.mark.parametrize("metric,linkage", [("euclidean", "ward"), ("euclidean", "average"), ("cosine", "average"),
                                            ("cosine", "complete"), ("manhattan", "single")])  # fmt: skip
def test_flhc_tree_on_gram_coordinates_is_the_tree_on_the_updates(metric, linkage):
    rows, truth = planted(groups=3, per_group=7, dim=2000, spread=0.6, seed=6)
    ref = AgglomerativeClustering(n_clusters=3, metric=metric, linkage=linkage).fit_predict(rows.double().numpy())
    ours = hierarchical_clusters(rows, metric, linkage, 3, None)
    assert adjusted_rand_score(ref, ours) == pytest.approx(1.0) and same_partition(ours, truth)
    # a threshold cuts the same tree: the merge distances are those of the updates
    model = AgglomerativeClustering(n_clusters=None, distance_threshold=1e-9, metric=metric, linkage=linkage,
                                    compute_distances=True).fit(rows.double().numpy())  # fmt: skip
    cut = float(np.median(model.distances_))
    ref_cut = AgglomerativeClustering(n_clusters=None, distance_threshold=cut, metric=metric, linkage=linkage)
    assert adjusted_rand_score(ref_cut.fit_predict(rows.double().numpy()), hierarchical_clusters(rows, metric, linkage, None, cut)) == pytest.approx(1.0)  # fmt: skip


def test_cgpfl_kmeans_equals_the_former_float32_kmeans_on_the_uploads():
    rows, truth = planted(groups=3, per_group=5, dim=3000, offset=1.0, seed=7)
    for seed in (0, 5):
        ref = KMeans(n_clusters=3, n_init=10, random_state=seed).fit_predict(rows.numpy())
        ours = kmeans_labels(rows, 3, seed)
        assert adjusted_rand_score(ref, ours) == pytest.approx(1.0) and same_partition(ours, truth)


def test_the_scaling_benchmark_runs_tiny_and_ends_with_its_json(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "server_scaling.py"
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(script), "--sizes", "6,9", "--dim", "40", "--rss-clients", "6", "--rss-methods", "ditto",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    methods = {"acmu", "fedac", "fesem", "fedgroup", "flhc", "ifca", "cgpfl"}
    assert set(result["seconds"]) == methods and set(result["cpu_seconds"]) == methods
    assert all(set(by_n) == {"6", "9"} and all(s >= 0 for s in by_n.values()) for by_n in result["seconds"].values())
    assert set(result["peak_rss_mb_by_run"]) == {"ditto/memory", "ditto/disk"}
    assert result["peak_rss_mb"] == max(result["peak_rss_mb_by_run"].values()) > 0
    assert json.loads(out.read_text()) == result
    bad = subprocess.run([sys.executable, str(script), "--sizes", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--sizes" in bad.stderr
