"""ACMU: Adaptive Cluster-based Model Update (MuPFL, Sec. 3.4, Eq. 7–15).

For the clients i, j reporting to one edge server,

    Dist(i, j) = α·cos(Δw_i, Δw_j) + (1 − α)·cos(M_i, M_j)                      (Eq. 8)

with Δw_i = w_i^t − w_i^(t−1) (Eq. 7) and M_i the client's BAVD activation map. Although the
paper calls it a distance, Dist is a similarity (1 for identical directions), so the
silhouette of Eq. 9–13 is computed on the distance 1 − Dist; otherwise maximising it would
prefer the worst partitions. k-means needs points, not a similarity: with unit vectors,

    e_i = [√α · Δw_i/‖Δw_i‖,  √(1−α) · M_i/‖M_i‖]   gives   ‖e_i − e_j‖² = 2·(1 − Dist(i, j)),

so k-means on e_i clusters by exactly the paper's similarity. The e_i have the model's
dimension d (plus the map's); k-means runs instead on n coordinates p_i with p_i·p_j = e_i·e_j
= Dist(i, j), from the eigendecomposition of the n×n matrix Dist (Y = U·Λ^{1/2}), whose entries
come from the Gram matrices of the updates and of the maps: the same problem exactly, since
k-means++ draws, Lloyd's means and the silhouettes depend on the points only through their
distances (``clustering.gram_coordinates``). That is one n×n×d product instead of 50 k-means
runs over d-dimensional points: 60 s → 1.7 s for 1,000 clients of 100,000 parameters
(``benchmarks/RESULTS.md``, "Server work at cross-device scale"). κ is the value in
[κ_min, κ_max] with the largest mean silhouette (scikit-learn's, which scores singletons 0
as Eq. 11 does), or fixed (Table V). Inside cluster C_l every client gets

    w̃_i = w_i^(t−1) + (1/|C_l|) Σ_{j∈C_l} Δw_j                                  (Eq. 14)

and the edge forwards Σ n_i·w̃_i with Σ n_i, so the server's mean over edges is Eq. 15.

Missing replies: an edge clusters only the replies it received. With adaptive κ and one or two
replies each client is its own cluster (w̃_i = w_i); with more, κ is searched up to replies − 1
(κ = min(κ_min, replies) if κ_min is above that). A fixed κ is capped at the number of replies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedtail.algorithms.base import Tensors
from fedtail.algorithms.clustering import flatten, gram, gram_coordinates, kmeans, project_gram, server_threads


def _cosines(rows: torch.Tensor) -> np.ndarray:
    """cos(x_i, x_j) of every pair of rows, from their Gram matrix (a zero row has cosine 0)."""
    g = gram(rows)
    norms = np.sqrt(np.clip(np.diag(g), 0.0, None))
    return g / np.maximum(np.outer(norms, norms), 1e-24)


@dataclass
class Embedding:
    """The clients' e_i, held as what k-means and the silhouette need of them.

    ``similarity`` is Dist (Eq. 8), i.e. e_i·e_j; ``points`` are n coordinates p_i with
    p_i·p_j = Dist(i, j) (so ‖p_i − p_j‖² = 2·(1 − Dist)); ``dim`` is the dimension of the e_i,
    for k-means' tolerance (``clustering.kmeans``).
    """

    similarity: np.ndarray
    points: np.ndarray
    dim: int


def embedding(deltas: torch.Tensor, maps: torch.Tensor | None, alpha: float) -> Embedding:
    """The e_i of the module docstring (rows of ``deltas`` and ``maps`` are clients), via Gram matrices."""
    if deltas.dim() != 2:
        raise ValueError(f"ACMU needs one flat update per client (a 2-D tensor), got shape {tuple(deltas.shape)}")
    dist = _cosines(deltas)
    dim = deltas.shape[1]
    if maps is not None and maps.shape[1] > 0 and alpha < 1:
        if len(maps) != len(deltas):
            raise ValueError(f"ACMU got {len(deltas)} updates but {len(maps)} activation maps")
        dist = alpha * dist + (1 - alpha) * _cosines(maps)
        dim += maps.shape[1]
    # Without maps (BAVD off) the similarity is the update term alone.
    return Embedding(dist, gram_coordinates(dist), dim)


def similarity(points: Embedding) -> np.ndarray:
    """Dist(i, j) of Eq. 8 (the Gram matrix of the e_i)."""
    return points.similarity


@dataclass
class Clustering:
    labels: np.ndarray  # cluster of each client, in the order given
    kappa: int
    silhouette: float  # mean silhouette of the chosen κ (0 when it is undefined)
    scores: dict[int, float]  # silhouette for every κ tried


def cluster_clients(
    points: Embedding, *, kappa: int | None, kappa_min: int, kappa_max: int, seed: int
) -> Clustering:
    """k-means for each κ in range (or the fixed κ); keep the κ with the best silhouette.

    k-means runs on ``points.points`` (n coordinates standing for the e_i exactly): the same
    partitions as k-means on the e_i themselves, with the same labels unless a decision falls
    within rounding (see ``clustering.kmeans``).
    """
    n = len(points.points)
    distance = np.clip(1.0 - similarity(points), 0.0, None)  # = 1 − Dist
    np.fill_diagonal(distance, 0.0)

    def run(k: int) -> np.ndarray:
        return kmeans(points.points, k, seed, n_init=10, dim=points.dim).labels_

    def score(labels: np.ndarray) -> float:
        k = len(np.unique(labels))
        if not 2 <= k <= n - 1:
            return 0.0
        from sklearn.metrics import silhouette_score  # here, not at the top: seconds off every process start

        with server_threads():
            return float(silhouette_score(distance, labels, metric="precomputed"))

    if kappa is not None:
        k = min(kappa, n)
        labels = run(k) if k > 1 else np.zeros(n, dtype=int)
        s = score(labels)
        return Clustering(labels, k, s, {k: s})
    if n <= 2:  # the silhouette needs 2 <= κ <= n − 1: nothing to choose, keep clients apart
        return Clustering(np.arange(n), n, 0.0, {})
    scores: dict[int, float] = {}
    best: tuple[float, int, np.ndarray] | None = None
    for k in range(max(2, kappa_min), min(kappa_max, n - 1) + 1):
        labels = run(k)
        scores[k] = score(labels)
        if best is None or scores[k] > best[0]:  # ties keep the smaller κ
            best = (scores[k], k, labels)
    if best is None:  # κ_min > n − 1
        k = min(kappa_min, n)
        labels = run(k)
        return Clustering(labels, k, score(labels), {})
    return Clustering(best[2], best[1], best[0], scores)


def plain_kmeans(weights: list[Tensors], keys: list[str], k: int, seed: int) -> np.ndarray:
    """Fig. 10's "K-Means" panel, which "use[s] the K-Means algorithm to perform model clustering
    with five central points": k-means (Euclidean, k-means++) of the clients' models w_i
    themselves, with as many clusters as ACMU formed (so the panels differ in the geometry alone),
    on the Gram coordinates of the centred models (the same problem, ``clustering.kmeans``). For
    the log only: nothing trains with it. Singletons where k ≥ n."""
    n = len(weights)
    if k >= n or n < 2:
        return np.arange(n)
    if k <= 1:
        return np.zeros(n, dtype=int)
    flat = torch.stack([flatten(w, keys) for w in weights])
    points = gram_coordinates(gram(flat, center=flat.mean(dim=0)))
    return kmeans(points, k, seed, n_init=10, dim=flat.shape[1]).labels_


def project_2d(points: Embedding) -> np.ndarray:
    """A 2-D PCA view of the clients' e_i (for the report's Fig. 10-style scatter), from Dist."""
    return project_gram(points.similarity)


def cluster_update(weights: list[Tensors], deltas: list[Tensors], labels: np.ndarray) -> list[Tensors]:
    """Eq. 14: w̃_i = (w_i − Δw_i) + mean of Δw over i's cluster (running float64 sums per cluster)."""
    out: list[Tensors] = []
    means: dict[int, Tensors] = {}
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        total = {k: v.to(torch.float64, copy=True) for k, v in deltas[members[0]].items()}
        for i in members[1:]:
            for k, v in deltas[i].items():
                total[k] += v
        means[int(label)] = {k: v / len(members) for k, v in total.items()}
    for w, d, label in zip(weights, deltas, labels):
        mean = means[int(label)]
        out.append({k: (w[k].to(torch.float64) - d[k].to(torch.float64) + mean[k]).to(w[k].dtype) for k in w})
    return out
