"""Pairwise similarity of the clients, from their data and from the models they are evaluated with.

FedAC's Fig. 2 (Zhang et al. 2024, Sec. 3.2) asks whether a similarity of two clients' *models*
tells how alike their *data* are: (b) the Kullback-Leibler divergence between the label
distributions of each client pair, the benchmark; (c) the L2 distance between their models;
(d) LrCos, the cosine of the models after a PCA to D dimensions. A run logs the three matrices
at chosen evaluated rounds (``--similarity-rounds``), of the model each client is evaluated with
(after the fine-tuning before evaluation, if any: Fig. 2 fine-tunes FedAvg's model locally).

- ``kl[i, j] = KL(p_i ‖ p_j) = Σ_c p_i(c) · log(p_i(c) / p_j(c))``, p_i the class frequencies of
  client i's training data. A class a client lacks makes the divergence infinite, which a heatmap
  cannot show and the paper does not discuss: the counts are smoothed by adding one sample of
  every class (Laplace, ``smoothing``), which the log records. Not symmetric, as KL is not.
- ``l2[i, j] = ‖w_i − w_j‖``, over every trainable parameter (the flattened model vectors).
- ``lrcos[i, j] = cos(M·w_i, M·w_j)``, M the PCA map of the n evaluated models fitted on them,
  centred at their mean (as FedAC's ``pca_center``: uncentred, the part all models share makes
  every cosine about 1), D = min(``dims``, n − 1) components (FedAC's D = 50), components of
  (numerically) zero variance dropped. Computed from the centred Gram matrix of the n models
  (n × n, float64), so no n × d decomposition is needed; L2 distances come from the same Gram.

How closely a model measure follows the data, the paper's claim for LrCos ("closely aligns with
the KL representations, whereas L2 distance inadequately captures this similarity"), is put in a
number: ``spearman_kl``, the Spearman rank correlation over the client pairs i < j between the
symmetrised KL, (KL(p_i‖p_j) + KL(p_j‖p_i)) / 2, and each measure as a dissimilarity (L2, and
1 − LrCos); 1 means the measure orders the pairs exactly as their data do.

MuPFL's Fig. 3(b), "prediction probabilities of each class" of FedAvg's classifier on long-tailed
data, showing "significant uncertainty within the model predictions" and "the entropy of the
model's predictions": the figure's axes are not in the text, so the log holds what both readings
need (``--class-probabilities``, :func:`class_probabilities`): the global model's mean softmax over
the global test images of each true class (a row per true class, a column per predicted class; the
diagonal is the mean probability of the right class) and the mean entropy of its predictions.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import spearmanr

LRCOS_DIMS = 50  # FedAC's D


def label_kl(counts: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """KL(p_i ‖ p_j) of the rows of ``counts`` (clients × classes), each smoothed by ``smoothing``."""
    p = np.asarray(counts, dtype=np.float64) + smoothing
    p /= p.sum(axis=1, keepdims=True)
    logp = np.log(p)
    # Σ_c p_i(c) (log p_i(c) − log p_j(c)) = Σ_c p_i log p_i − (p_i · log p_j)
    return (p * logp).sum(axis=1)[:, None] - p @ logp.T


def centred_gram(models: torch.Tensor) -> np.ndarray:
    """(X − mean)(X − mean)ᵀ of the rows of ``models`` (n × d), in float64."""
    x = models.to(torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    return (x @ x.T).cpu().numpy()


def model_distances(gram: np.ndarray) -> np.ndarray:
    """‖w_i − w_j‖ from the centred Gram matrix (centring does not move distances)."""
    d = np.diag(gram)
    return np.sqrt(np.clip(d[:, None] + d[None, :] - 2 * gram, 0, None))


def lrcos(gram: np.ndarray, dims: int = LRCOS_DIMS) -> tuple[np.ndarray, int]:
    """Cosines of the models' PCA coordinates (the centred Gram's top ``dims`` eigenvectors scaled
    by the square roots of their eigenvalues, the scores an SVD of X − mean gives) and the number
    of components kept."""
    n = len(gram)
    values, vectors = np.linalg.eigh(gram)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    keep = min(dims, max(n - 1, 0), int((values > values[:1].clip(min=0) * 1e-10).sum()) if n else 0)
    scores = vectors[:, :keep] * np.sqrt(values[:keep].clip(min=0))
    norms = np.linalg.norm(scores, axis=1, keepdims=True)
    unit = np.divide(scores, norms, out=np.zeros_like(scores), where=norms > 0)
    return unit @ unit.T, keep


def client_similarity(
    models: torch.Tensor, label_counts: np.ndarray, dims: int = LRCOS_DIMS, smoothing: float = 1.0
) -> dict:
    """The three matrices of FedAC's Fig. 2 for n clients (rows of ``models``, flattened model
    vectors; rows of ``label_counts``, their training samples per class), as lists for the log."""
    gram = centred_gram(models)
    cos, kept = lrcos(gram, dims)
    kl, l2 = label_kl(label_counts, smoothing), model_distances(gram)
    return {
        "kl": kl.round(6).tolist(),
        "l2": l2.round(6).tolist(),
        "lrcos": cos.round(6).tolist(),
        "lrcos_dims": kept,
        "kl_smoothing": smoothing,
        "spearman_kl": {"l2": rank_agreement(kl, l2), "lrcos": rank_agreement(kl, 1 - cos)},
    }


def rank_agreement(kl: np.ndarray, dissimilarity: np.ndarray) -> float | None:
    """Spearman's ρ over the pairs i < j between the symmetrised KL and ``dissimilarity``
    (None with fewer than 3 pairs, or where either is constant)."""
    upper = np.triu_indices(len(kl), k=1)
    a, b = ((kl + kl.T) / 2)[upper], dissimilarity[upper]
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return round(float(spearmanr(a, b).statistic), 6)


def class_probabilities(counts) -> dict:
    """The log's ``global_class_probabilities`` (true class × predicted class, mean softmax; a class
    without test images: a row of nulls) and ``global_prediction_entropy`` (mean, nats) of an
    evaluation with ``probabilities=True`` (:class:`fedtail.engine.training.EvalCounts`)."""
    total = counts.total.numpy().astype(np.float64)
    sums = counts.prob_sum.numpy()
    rows = [(sums[c] / total[c]).round(6).tolist() if total[c] else [None] * len(total) for c in range(len(total))]
    n = total.sum()
    return {"global_class_probabilities": rows,
            "global_prediction_entropy": round(counts.entropy_sum / n, 6) if n else None}  # fmt: skip
