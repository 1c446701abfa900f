"""ACMU: Adaptive Cluster-based Model Update (MuPFL, Sec. 3.4, Eq. 7–15).

For the clients i, j reporting to one edge server,

    Dist(i, j) = α·cos(Δw_i, Δw_j) + (1 − α)·cos(M_i, M_j)                      (Eq. 8)

with Δw_i = w_i^t − w_i^(t−1) (Eq. 7) and M_i the client's BAVD activation map. Although the
paper calls it a distance, Dist is a similarity (1 for identical directions), so the
silhouette of Eq. 9–13 is computed on the distance 1 − Dist; otherwise maximising it would
prefer the worst partitions. k-means needs points, not a similarity: with unit vectors,

    e_i = [√α · Δw_i/‖Δw_i‖,  √(1−α) · M_i/‖M_i‖]   gives   ‖e_i − e_j‖² = 2·(1 − Dist(i, j)),

so k-means on e_i clusters by exactly the paper's similarity. κ is the value in
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
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.metrics import silhouette_score

from fedtail.algorithms.base import Tensors


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    norms = x.norm(dim=1, keepdim=True)
    return x / norms.clamp_min(1e-12)


def embedding(deltas: torch.Tensor, maps: torch.Tensor | None, alpha: float) -> np.ndarray:
    """Points whose squared distances are 2·(1 − Dist): rows are clients (float64)."""
    deltas = deltas.to(torch.float64)
    parts = [alpha**0.5 * _unit_rows(deltas)]
    if maps is not None and maps.shape[1] > 0 and alpha < 1:
        parts.append((1 - alpha) ** 0.5 * _unit_rows(maps.to(torch.float64)))
    elif alpha < 1:
        # Without maps (BAVD off) the similarity is the update term alone.
        parts = [_unit_rows(deltas)]
    return torch.cat(parts, dim=1).numpy()


def similarity(points: np.ndarray) -> np.ndarray:
    """Dist(i, j) of Eq. 8 recovered from the embedding (its Gram matrix)."""
    return points @ points.T


@dataclass
class Clustering:
    labels: np.ndarray  # cluster of each client, in the order given
    kappa: int
    silhouette: float  # mean silhouette of the chosen κ (0 when it is undefined)
    scores: dict[int, float]  # silhouette for every κ tried


def cluster_clients(
    points: np.ndarray, *, kappa: int | None, kappa_min: int, kappa_max: int, seed: int
) -> Clustering:
    """k-means for each κ in range (or the fixed κ); keep the κ with the best silhouette."""
    n = len(points)
    distance = np.clip(2.0 - 2.0 * similarity(points), 0.0, None) / 2.0  # = 1 − Dist
    np.fill_diagonal(distance, 0.0)

    def run(k: int) -> np.ndarray:
        return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(points)

    def score(labels: np.ndarray) -> float:
        k = len(np.unique(labels))
        return float(silhouette_score(distance, labels, metric="precomputed")) if 2 <= k <= n - 1 else 0.0

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


def project_2d(points: np.ndarray) -> np.ndarray:
    """A 2-D PCA view of the clients' points (for the report's Fig. 10-style scatter)."""
    if len(points) < 2:
        return np.zeros((len(points), 2))
    out = PCA(n_components=min(2, len(points)), random_state=0).fit_transform(points)
    return np.pad(out, ((0, 0), (0, 2 - out.shape[1])))


def cluster_update(weights: list[Tensors], deltas: list[Tensors], labels: np.ndarray) -> list[Tensors]:
    """Eq. 14: w̃_i = (w_i − Δw_i) + mean of Δw over i's cluster."""
    out: list[Tensors] = []
    means: dict[int, Tensors] = {}
    for label in np.unique(labels):
        members = [deltas[i] for i in np.flatnonzero(labels == label)]
        means[int(label)] = {
            k: torch.stack([d[k].to(torch.float64) for d in members]).mean(0) for k in members[0]
        }
    for w, d, label in zip(weights, deltas, labels):
        mean = means[int(label)]
        out.append({k: (w[k].to(torch.float64) - d[k].to(torch.float64) + mean[k]).to(w[k].dtype) for k in w})
    return out
