"""Shared pieces of the clustered FL methods (FedAC, IFCA, FeSEM, FedGroup, FL+HC, CGPFL).

Models are compared as flat vectors of their floating-point tensors (integer buffers such as
BatchNorm's ``num_batches_tracked`` carry no information about the data). The server keeps
those vectors in float32; distances are taken in float64.

Every clustered method logs a ``clustering`` record each round in ``metrics.jsonl``, see
:func:`cluster_record`. The full record, every ``log_clustering_every`` rounds of the run and at
its last round (:func:`full_record`), is ``{"num_clusters": K, "clients": [...], "clusters":
[...], "pca": [[x, y], ...]}`` (``pca``: the clients' vectors in 2-D, for the report's cluster
scatter) plus the method's own entries; the other rounds log ``num_clusters`` and the method's
small entries only. A full record of FedAC with 100 clients is about 3 KB, so one every round
made 3.4 MB of a 1000-round run's ``metrics.jsonl``; the 2-D view (a PCA of full-size model
vectors for FeSEM, IFCA, CGPFL) is computed only for full records.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from sklearn.decomposition import PCA

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import Tensors


def float_keys(tensors: Tensors) -> list[str]:
    """Names of the floating-point tensors, in the state dict's order."""
    return [k for k, v in tensors.items() if v.is_floating_point()]


def flatten(tensors: Tensors, keys: Sequence[str]) -> torch.Tensor:
    """One float32 vector of ``tensors[k]`` for ``k`` in ``keys``, in that order."""
    return torch.cat([tensors[k].detach().reshape(-1).to(torch.float32) for k in keys])


def unflatten(vector: torch.Tensor, template: Tensors, keys: Sequence[str]) -> Tensors:
    """Inverse of :func:`flatten`: tensors shaped and typed like ``template[k]``."""
    out: Tensors = {}
    start = 0
    for k in keys:
        ref = template[k]
        out[k] = vector[start : start + ref.numel()].reshape(ref.shape).to(ref.dtype)
        start += ref.numel()
    if start != vector.numel():
        raise ValueError(f"vector has {vector.numel()} values, the template {start}")
    return out


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``a`` with every row of ``b`` (float64)."""
    a = a.to(torch.float64)
    b = b.to(torch.float64)
    a = a / a.norm(dim=1, keepdim=True).clamp_min(1e-12)
    b = b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return a @ b.T


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a_i − b_k‖² for every row pair (float64, exact differences rather than the Gram trick)."""
    return torch.cdist(a.to(torch.float64), b.to(torch.float64)).pow(2)


def cluster_means(vectors: torch.Tensor, labels: np.ndarray, weights: Iterable[float] | None = None) -> dict[int, torch.Tensor]:
    """Weighted mean vector of each cluster label present (Eq. 5 of FedAC with unit weights)."""
    w = np.ones(len(labels)) if weights is None else np.asarray(list(weights), dtype=float)
    out: dict[int, torch.Tensor] = {}
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        mean = WeightedMean()
        for r in rows:
            mean.add({"v": vectors[r]}, float(w[r]))
        out[int(label)] = mean.result()["v"]
    return out


def project_2d(points: np.ndarray | torch.Tensor) -> list[list[float]]:
    """A 2-D PCA view of the rows (for plots); zeros when there are fewer than 2 rows."""
    x = np.asarray(points, dtype=np.float64)
    if len(x) < 2:
        return [[0.0, 0.0] for _ in range(len(x))]
    out = PCA(n_components=min(2, len(x), x.shape[1]), random_state=0).fit_transform(x)
    out = np.pad(out, ((0, 0), (0, 2 - out.shape[1])))
    return np.round(out, 5).tolist()


def full_record(config, rnd: int) -> bool:
    """Whether round ``rnd`` logs the full clustering record: every ``log_clustering_every`` rounds, and the last."""
    return rnd % config.log_clustering_every == 0 or rnd == config.rounds


Points = np.ndarray | torch.Tensor | list | Callable[[], np.ndarray | torch.Tensor]


def cluster_record(
    clients: Sequence[int],
    labels: Sequence[int],
    points: Points | None = None,
    *,
    full: bool = True,
    view: list[list[float]] | None = None,
    **extra,
) -> dict:
    """The per-round ``clustering`` log entry (JSON-serialisable).

    ``points``: the clients' vectors, projected to 2-D here (a callable giving them is called only
    for a full record, so its work is skipped otherwise); ``view``: a 2-D view already projected.
    ``full=False`` (see :func:`full_record`) keeps ``num_clusters`` and ``extra`` only: the
    assignment lists and the view are what make a record large.
    """
    labels = [int(x) for x in labels]
    rec: dict = {"num_clusters": len(set(labels))}
    if not full:
        return rec | extra
    rec |= {"clients": [int(c) for c in clients], "clusters": labels}
    if view is not None:
        rec["pca"] = view
    elif points is not None:
        rec["pca"] = project_2d(points() if callable(points) else points)
    return rec | extra


def relabel(labels: np.ndarray) -> np.ndarray:
    """Cluster labels renumbered 0..K−1 in order of first appearance (stable for logs)."""
    mapping: dict[int, int] = {}
    return np.array([mapping.setdefault(int(x), len(mapping)) for x in labels], dtype=int)
