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

**Cross-device scale** (issue 21). k-means centroids, PCA components, Ward merges and
silhouettes depend on the client vectors x_1..x_n ∈ R^d only through their inner products (or
distances), and all of them lie in the span of the points. So with d ≫ n the problem is, exactly,
one in n coordinates: from the Gram matrix G = X Xᵀ (one n×n×d product, :func:`gram`), the
eigendecomposition G = U Λ Uᵀ gives Y = U Λ^{1/2} (:func:`gram_coordinates`) with Y Yᵀ = G, so
every inner product and distance of the rows of Y is that of the rows of X. Clustering Y costs
milliseconds instead of seconds; the one pass over the d-dimensional data is the product.

Precision: the product runs in float32 BLAS (what the vectors are stored in) by column blocks
summed in float64, after subtracting a common reference row where only distances matter (a
shift changes no distance, and it removes the part all models share, which would otherwise
dominate the float32 rounding). Entries of G are then exact to about 1e-6 of ‖x_i‖·‖x_j‖ (of
the shifted vectors): a float64 product would cost twice as much for digits no decision here
resolves. Partitions therefore equal those of the d-dimensional computations except where a
decision is a tie within ~1e-6 (tests compare them on separated clusters).
Distances and cosines between a few vectors and many (E-steps) are computed in float64 by row
blocks, so no float64 copy of all the vectors is ever made.

Linear algebra on the server uses as many BLAS / OpenMP threads as torch does (``--threads``):
on a loaded machine more threads than cores made a 1000×1000 eigendecomposition ten times slower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import Tensors

if TYPE_CHECKING:
    from sklearn.cluster import KMeans


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


# --- exact geometry of many long vectors -------------------------------------------------------

BLOCK_VALUES = 1 << 22  # values per block of a blockwise pass (16 MB of float32, 32 MB of float64)
EIG_RTOL = 1e-12  # eigenvalues below this fraction of the largest are rounding noise of a rank-deficient G


def server_threads():
    """BLAS and OpenMP threads limited to torch's (``--threads``) for server-side linear algebra."""
    return threadpool_limits(limits=torch.get_num_threads())


def _rows(x: np.ndarray | torch.Tensor | list) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    return torch.from_numpy(np.asarray(x, dtype=np.float64) if isinstance(x, list) else x)


def row_mean(rows: torch.Tensor) -> torch.Tensor:
    """The mean row, accumulated in float64 by row blocks (no float64 copy of all rows)."""
    rows = _rows(rows)
    n, d = rows.shape
    step = max(1, BLOCK_VALUES // max(d, 1))
    total = torch.zeros(d, dtype=torch.float64, device=rows.device)
    for i in range(0, n, step):
        total += rows[i : i + step].to(torch.float64).sum(0)
    return total / max(n, 1)


def gram(rows: np.ndarray | torch.Tensor, center: torch.Tensor | None = None) -> np.ndarray:
    """G = (X − c)(X − c)ᵀ (float64, n×n) of the rows X, minus ``center`` c if given.

    float32 products (BLAS syrk) of column blocks, summed in float64: memory stays one block.
    """
    x = _rows(rows).to(torch.float32).numpy()
    n, d = x.shape
    c = None if center is None else center.detach().to(torch.float32).numpy()
    width = max(1, min(d, BLOCK_VALUES // max(n, 1)))
    out = np.zeros((n, n))
    buffer = np.empty((n, width), dtype=np.float32)
    with server_threads():
        for a in range(0, d, width):
            b = min(a + width, d)
            block = buffer if b - a == width else np.empty((n, b - a), dtype=np.float32)
            if c is None:
                np.copyto(block, x[:, a:b])
            else:
                np.subtract(x[:, a:b], c[a:b], out=block)
            out += block @ block.T  # numpy computes A·Aᵀ with syrk: half the work of a general product
    return out


def double_centre(g: np.ndarray) -> np.ndarray:
    """J G J (J = I − 11ᵀ/n): the Gram matrix of the rows minus their mean, from any Gram matrix of theirs."""
    row = g.mean(axis=1, keepdims=True)
    return g - row - row.T + g.mean()


def centred_gram(rows: np.ndarray | torch.Tensor) -> np.ndarray:
    """Gram matrix of the rows minus their mean.

    The product is taken of the rows minus the first row (a shift changes no distance, and
    differences of close rows lose nothing to float32), then centred exactly in float64
    (:func:`double_centre`): no pass over the data to compute the mean.
    """
    rows = _rows(rows)
    return double_centre(gram(rows, rows[0])) if len(rows) else np.zeros((0, 0))


def gram_coordinates(g: np.ndarray, rtol: float = EIG_RTOL) -> np.ndarray:
    """Y (n×r, r ≤ n, float64) with Y Yᵀ = G: Y = U·Λ^{1/2} from G's eigendecomposition.

    Eigenvalues at or below ``rtol``·λ_max (and negative ones, from rounding) are dropped: they
    are rounding noise of a rank-deficient G. Columns are in decreasing order of eigenvalue.
    """
    n = len(g)
    if n == 0:
        return np.zeros((0, 1))
    with server_threads():
        w, v = np.linalg.eigh((g + g.T) / 2)
    top = max(float(w[-1]), 0.0)
    keep = np.flatnonzero(w > rtol * top) if top > 0 else np.zeros(0, dtype=int)
    if len(keep) == 0:  # all rows equal (zero after centring): one coordinate of zeros
        return np.zeros((n, 1))
    keep = keep[::-1]
    return v[:, keep] * np.sqrt(w[keep])


def top_eigenpairs(g: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenvalues of the symmetric ``g`` (ascending) and their eigenvectors.

    LAPACK's subset solver (scipy ``evr``): a fraction of a full decomposition's time for a few pairs.
    """
    import scipy.linalg  # here, not at the top: seconds off every process start

    n = len(g)
    count = min(count, n)
    with server_threads():
        return scipy.linalg.eigh((g + g.T) / 2, subset_by_index=[n - count, n - 1], driver="evr")


def kmeans(points: np.ndarray, k: int, seed: int, *, n_init: int = 10, max_iter: int = 300, dim: int | None = None) -> KMeans:
    """scikit-learn's k-means (k-means++) on ``points``, fitted; ``dim``: the dimension they stand for.

    On Gram coordinates (:func:`gram_coordinates`) of d-dimensional vectors this is the same
    problem as on the vectors: k-means++ samples by squared distances and Lloyd's steps are means
    and distances, all preserved. scikit-learn's stopping tolerance is 1e-4 × the mean variance
    per feature, which depends on the number of features; with ``dim`` = d it is rescaled so the
    stopping rule is the same absolute one as on the vectors. The labels are then the same in
    exact arithmetic; in floating point they match unless a decision falls within rounding
    (a k-means++ draw or an assignment at a near tie), so tests compare partitions.
    """
    from sklearn.cluster import KMeans  # here, not at the top: seconds off every process start

    tol = 1e-4 if dim is None else 1e-4 * points.shape[1] / max(dim, 1)
    with server_threads():
        return KMeans(n_clusters=k, n_init=n_init, max_iter=max_iter, tol=tol, random_state=seed).fit(points)


def _blocks(a: torch.Tensor) -> range:
    return range(0, len(a), max(1, BLOCK_VALUES // max(a.shape[1], 1)))


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``a`` with every row of ``b`` (float64, by row blocks of ``a``)."""
    a, b = _rows(a), _rows(b).to(torch.float64)
    b = b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)
    out = torch.empty(len(a), len(b), dtype=torch.float64, device=a.device)
    step = _blocks(a).step
    for i in _blocks(a):
        block = a[i : i + step].to(torch.float64)
        out[i : i + step] = (block / block.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ b.T
    return out


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a_i − b_k‖² for every row pair (float64, by row blocks of ``a``).

    ‖ã‖² + ‖b̃‖² − 2 ã·b̃ after subtracting the mean row of ``b`` from both (a shift changes no
    distance): the float64 products then lose no digit that matters even for rows close together.
    """
    a, b = _rows(a), _rows(b).to(torch.float64)
    ref = b.mean(0)
    b = b - ref
    b_norms = b.pow(2).sum(1)
    out = torch.empty(len(a), len(b), dtype=torch.float64, device=a.device)
    step = _blocks(a).step
    for i in _blocks(a):
        block = a[i : i + step].to(torch.float64) - ref
        out[i : i + step] = (block.pow(2).sum(1, keepdim=True) + b_norms - 2 * block @ b.T).clamp_min(0)
    return out


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


def project_gram(g: np.ndarray) -> np.ndarray:
    """The 2-D PCA scores (n×2) of the rows whose Gram matrix is ``g`` (any centre: it is removed).

    The top two eigenvectors of the centred Gram matrix times √λ are the PCA scores. A principal
    axis has no sign of its own; each is oriented so that its largest score (in absolute value) is
    positive, which depends on the rows only (scikit-learn orients by the components, i.e. by the
    coordinates, so the Gram route and the vectors would not agree there). Axes of zero variance
    give zeros.
    """
    n = len(g)
    out = np.zeros((n, 2))
    if n < 2:
        return out
    w, v = top_eigenpairs(double_centre(g), 2)
    top = max(float(w[-1]), 0.0)
    for axis, j in enumerate((len(w) - 1, len(w) - 2)):
        if j < 0 or top <= 0 or w[j] <= EIG_RTOL * top:
            continue
        score = v[:, j] * np.sqrt(w[j])
        out[:, axis] = score if score[np.argmax(np.abs(score))] >= 0 else -score
    return out


def project_2d(points: np.ndarray | torch.Tensor) -> list[list[float]]:
    """A 2-D PCA view of the rows (for plots), rounded; zeros when there are fewer than 2 rows.

    From the rows' centred Gram matrix (:func:`project_gram`): the same scores as a PCA of the
    rows, up to the sign of each axis, at the cost of one n×n×d product.
    """
    x = _rows(points)
    if len(x) < 2:
        return [[0.0, 0.0] for _ in range(len(x))]
    if x.shape[1] > len(x):
        g = centred_gram(x)
    else:  # few coordinates (reduced or Gram coordinates already): exact in float64
        c = x.to(torch.float64) - x.to(torch.float64).mean(0)
        g = (c @ c.T).numpy()
    return np.round(project_gram(g), 5).tolist()


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
