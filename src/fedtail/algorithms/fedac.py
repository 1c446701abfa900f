"""FedAC: adaptive clustered FL with global knowledge in the clusters.

Zhang, Chen, Lin, Chen and Zhao, "FedAC: An Adaptive Clustered Federated Learning Framework
for Heterogeneous Data", arXiv:2403.16460, 2024 (the FedAC paper, Alg. 1–3, Eq. 3–5). Each client i
keeps a personal model ω_i = (φ_i, h_i) (embedding = body, decision = head). The server keeps
cluster centres Ω_k (whole models), a global embedding Φ and the assignment R.

Local update (Alg. 1, LocalUpdate), SGD on

    L_sup(ω_i) + (μ/2)·‖ω_i − Ω_k*(i)‖² + (λ/2)·‖φ_i − Φ‖²                       (Eq. 3)

Server, after the sampled clients S_t upload ω_i:

    Φ ← mean_{i∈S_t} φ_i                                                        (Alg. 1, l. 9)
    LrCos(ω_i, Ω_k) = cos(M·ω_i, M·Ω_k), M = PCA map of D components, refit sparsely (Alg. 2)
    E-step: k*(i) = argmax_k LrCos(ω_i, Ω_k)                                    (Eq. 4)
    M-step: Ω_k = mean of the members' ω_i                                      (Eq. 5)
    CNT: G_c^k = Dist_intra^k / Dist_inter^k, Dist_intra^k = mean_{i∈k} ‖ω_i − Ω_k‖²,
         Dist_inter^k = mean_{j≠k} ‖Ω_k − Ω_j‖²; merge k into its nearest cluster if G_c^k < a,
         split it in two (two new centres, one re-clustering pass) if G_c^k > b     (Alg. 3)

Interpretations where the paper is silent or inconsistent (each an option or noted here):

- Eq. 4 writes argmin of LrCos, a similarity; the E-step takes the most similar centre.
- Φ and Ω_k are plain means (Alg. 1 writes sums; the objectives of Sec. 3 and Eq. 3 weigh the
  clients equally, (1/m) Σ_i); ``weighted=true`` weights them by sample counts instead.
- The server keeps each client's last uploaded model, so the E-step, M-step and CNT run over
  every client seen so far, as Alg. 1 writes them over i ∈ [m]. The server computes M·ω_i
  from the upload rather than receiving it (same number; the paper sends it to save compute).
- The PCA map is fitted on all known client models (``pca_every`` rounds apart; the paper:
  "e.g. every 100 rounds"), with D capped at (known clients − 1), since the 25 models of a
  round cannot give the paper's D = 50 components. The coordinates are centred at the
  fitting sample's mean (``pca_center``): uncentred, the part all models share dominates and
  every cosine is close to 1.
- R^0 and Ω^0: after the first round, k-means (scikit-learn) with K = ``num_clusters`` on
  the unit-normalised PCA coordinates (cosine geometry) gives the first assignment.
- ``first_start``: where a client's personal model starts before its first upload. Alg. 1
  sets every client's model at the start, before any round: "Initialize: R^0,
  {ω_i^0 = (φ_i^0, h_i^0)}_{i∈[m]}, {Ω_k^0}_{k∈[K]}, Φ^0" (line 1), and a client's local update
  starts from its own model, "ω_i^{t,0} = ω_i^t" (LocalUpdate, line 1). So a client training for
  the first time starts from ω_i^0, set before anything was uploaded; the paper does not say what
  ω_i^0 is. ``init`` (the default): the run's common initial model, where local training starts
  every client. ``uploaded-mean``: the mean of the models uploaded so far (fedtail's FedAC
  before this option existed), a head start from other clients' training that FedAC's Alg. 1
  does not give and local training does not get. A client that has not uploaded is evaluated
  with that same model.
- A client not assigned yet is pulled towards the mean of the known client models (the
  initial model before any upload): Ω^0 and R^0 are not specified either.
- CNT: all G_c are computed first; clusters below a merge into the nearest centre (L2, the
  distance CNT measures in), each cluster absorbing or being absorbed at most once per round;
  then clusters above b with two or more members are split by one k-means iteration from
  k-means++ centres, while K < ``max_clusters``. With K = 1, Dist_inter is undefined and CNT
  does nothing. Empty clusters after an E-step are dropped.
- ``similarity=l2`` is the ablation of Sec. 5.4 (assignment by the nearest centre in L2).

Missing replies (``--dropout``, rejected replies): Φ is the mean of the uploads that arrived; a
client that did not reply keeps its last upload in the E-step, M-step and CNT (as a client not
sampled), or stays unknown. R^0 waits until min(K, clients per round) clients have uploaded (no
``clustering`` log until then; the PCA map is fitted then), since k-means on fewer models gives
fewer clusters, and a lone cluster CNT cannot split; meanwhile every client, uploaded or not, is
pulled towards the mean of the known models.

Server cost at scale (issue 21). The PCA of Alg. 2 is computed from the centred Gram matrix
Gc = (X − μ)(X − μ)ᵀ of the n known models (taken of the models minus the first, then centred
exactly: ``clustering.centred_gram``): with Gc = U Λ Uᵀ the principal components are
V = Λ^{-1/2} Uᵀ (X − μ), the same vectors an SVD of X − μ gives (up to the sign of each, which no
cosine of the E-step sees), and the fitted models' coordinates are U Λ^{1/2}: one n×n×d product
instead of an n×d SVD (:func:`fit_map_scores`).
Components of (numerically) zero variance are dropped (an SVD returns arbitrary directions there,
orthogonal to every fitted model). CNT's distances are those of weighted means of models, so with
A the member weights (rows summing to 1) ‖ω_i − Ω_k‖² = Gc_ii − 2 (Gc Aᵀ)_ik + (A Gc Aᵀ)_kk and
‖Ω_k − Ω_l‖² from A Gc Aᵀ, exactly; the split's k-means runs on the members' Gram coordinates.
Entries of Gc are float32 products of centred models summed in float64 (relative error ~1e-6,
see :mod:`fedtail.algorithms.clustering`); assignments equal those of the former d-dimensional
computation on separated clusters (``tests/test_fedac.py``). The server keeps the known models in
one float32 matrix that grows by doubling.

Model split (reference setting, ``fedtail list``): the embedding φ is all but the last layer
(the paper), so runs get ``--head last``; for convnet that is the model's own split.

Devices: the server's clustering (PCA on the Gram matrix, LrCos, the EM steps, G_c) runs on the
CPU, where the uploads arrive; clients train on ``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtail.algorithms.aggregate import PER_CLUSTER, WeightedMean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    Comm,
    Message,
    PersonalClient,
    Reference,
    ServerHalf,
    Tensors,
    Term,
)
from fedtail.algorithms.clustering import (
    BLOCK_VALUES,
    EIG_RTOL,
    cluster_means,
    cluster_record,
    cosine_matrix,
    double_centre,
    float_keys,
    flatten,
    full_record,
    gram as gram_matrix,
    gram_coordinates,
    kmeans,
    relabel,
    row_mean,
    squared_distances,
    top_eigenpairs,
    unflatten,
)

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import ExtraLoss

GLOBAL = "global/"  # prefix of the global embedding Φ's tensors in a fit message


class FedACConfig(AlgorithmConfig):
    num_clusters: int = Field(4, ge=1, description="initial number of clusters K (CNT adjusts it)")
    # 0.01: the best μ of the 1000-round validation (benchmarks/fedac/VALIDATION1000.md); the paper gives none
    mu: float = Field(0.01, ge=0, description="μ: pull of the personal model towards its cluster centre")
    lam: float = Field(0.1, ge=0, description="λ: pull of the personal embedding towards the global embedding Φ")
    similarity: Literal["lrcos", "l2"] = Field("lrcos", description="E-step similarity (l2: the Sec. 5.4 ablation)")
    pca_dims: int = Field(50, ge=1, description="D: PCA components of LrCos")
    pca_every: int = Field(100, ge=1, description="rounds between refits of the PCA map")
    pca_center: bool = Field(True, description="centre models at the PCA mean before the cosine")
    cnt: bool = Field(True, description="cluster number tuning (Alg. 3)")
    gc_low: float = Field(0.2, gt=0, description="a: merge a cluster whose G_c is below")
    gc_high: float = Field(0.8, gt=0, description="b: split a cluster whose G_c is above")
    max_clusters: int = Field(20, ge=1, description="CNT never splits beyond this many clusters")
    weighted: bool = Field(False, description="sample-weighted Φ and Ω_k (the paper: plain means)")
    first_start: Literal["init", "uploaded-mean"] = Field(
        "init",
        description="a client's model before its first upload: the run's initial model (Alg. 1's ω_i^0) "
        "or the mean of the models uploaded so far",
    )

    @model_validator(mode="after")
    def _ranges(self) -> "FedACConfig":
        if self.gc_low >= self.gc_high:
            raise ValueError(f"gc_low ({self.gc_low}) must be below gc_high ({self.gc_high})")
        if self.num_clusters > self.max_clusters:
            raise ValueError(f"num_clusters ({self.num_clusters}) must not exceed max_clusters ({self.max_clusters})")
        return self


# --- the server's clustering steps, on flat model vectors (rows) ------------------------------


PCAMap = dict  # {"reference": r (float32, d), "offset": (μ − r)·Vᵀ (float64, D), "components": V (float32, D×d)}


def fit_map_scores(
    models: torch.Tensor, dims: int, gram: np.ndarray | None = None, reference: torch.Tensor | None = None
) -> tuple[PCAMap | None, torch.Tensor | None]:
    """UpdateMap (Alg. 2) and the fitted rows' PCA scores (M·ω − M·μ, float64); (None, None) if < 2 rows.

    ``gram``: the Gram matrix of ``models − reference`` (both computed if not given; the
    reference is a float32 row close to the models, by default the first). With Gc its centred
    form, Gc = U Λ Uᵀ, and W = Λ_D^{-1/2} U_Dᵀ for the top D = min(dims, rows − 1) eigenpairs
    (zero-variance ones dropped): V = W (X − r) (the rows of W sum to 0, so any reference gives
    the same V), the scores are U_D Λ_D^{1/2} = G Wᵀ − mean, and the offset (μ − r)·Vᵀ is the mean
    row of G Wᵀ: M·ω = V·(ω − μ) = V·(ω − r) − offset, with no pass for μ.
    """
    n = len(models)
    if n < 2:
        return None, None
    if gram is None or reference is None:
        reference = models[0].clone()
        gram = gram_matrix(models, reference)
    w, u = top_eigenpairs(double_centre(gram), max(1, min(dims, n - 1)))
    top = np.arange(len(w) - 1, -1, -1)
    top = top[w[top] > EIG_RTOL * max(float(w[-1]), 0.0)]
    if len(top) == 0:  # every model the same: no direction to project on
        return None, None
    coef = (u[:, top] / np.sqrt(w[top])).T  # W, D×n
    projected = gram @ coef.T  # (X − r)·Vᵀ of the fitted rows
    offset = projected.mean(axis=0)
    coef32 = torch.from_numpy(coef.astype(np.float32))
    ref = reference.to(torch.float32)
    width = max(1, BLOCK_VALUES // n)
    components = torch.empty(len(top), models.shape[1], dtype=torch.float32, device=models.device)
    for a in range(0, models.shape[1], width):
        components[:, a : a + width] = coef32 @ (models[:, a : a + width] - ref[a : a + width])
    pca = {"reference": ref, "offset": torch.from_numpy(offset), "components": components}
    return pca, torch.from_numpy(projected - offset)


def fit_map(
    models: torch.Tensor, dims: int, seed: int | None = None, gram: np.ndarray | None = None,
    reference: torch.Tensor | None = None,
) -> PCAMap | None:  # fmt: skip
    """UpdateMap (Alg. 2): a PCA of the rows with at most ``dims`` components; None if < 2 rows.

    See :func:`fit_map_scores`; ``seed`` is unused (the decomposition is exact).
    """
    return fit_map_scores(models, dims, gram, reference)[0]


def reduce(pca: PCAMap | None, rows: torch.Tensor, center: bool) -> torch.Tensor:
    """M·ω for each row (float64); the rows themselves without a map. By row blocks (float32 products).

    V·(ω − r) − offset centred (= V·(ω − μ)), V·(ω − r) + V·r uncentred (= V·ω).
    """
    if pca is None:
        return rows.to(torch.float64)
    components, ref = pca["components"], pca["reference"]
    shift = -pca["offset"] if center else ref.to(torch.float64) @ components.to(torch.float64).T
    out = torch.empty(len(rows), len(components), dtype=torch.float64, device=rows.device)
    step = max(1, BLOCK_VALUES // max(rows.shape[1], 1))
    for i in range(0, len(rows), step):
        out[i : i + step] = ((rows[i : i + step].to(torch.float32) - ref) @ components.T).to(torch.float64) + shift
    return out


def e_step(
    models: torch.Tensor, centres: torch.Tensor, similarity: str, pca: PCAMap | None, center: bool,
    reduced: torch.Tensor | None = None,
) -> np.ndarray:  # fmt: skip
    """Eq. 4: each row's most similar centre (LrCos) or nearest centre (L2).

    ``reduced``: ``reduce(pca, models, center)`` if already known (the scores of a refit).
    """
    if similarity == "l2":
        return squared_distances(models, centres).argmin(dim=1).numpy()
    points = reduce(pca, models, center) if reduced is None else reduced
    sim = cosine_matrix(points, reduce(pca, centres, center))
    return sim.argmax(dim=1).numpy()


def m_step(models: torch.Tensor, labels: np.ndarray, weights: np.ndarray | None) -> tuple[torch.Tensor, np.ndarray]:
    """Eq. 5: centres of the non-empty clusters, and the labels renumbered to match them."""
    labels = relabel(labels)
    means = cluster_means(models, labels, weights)
    return torch.stack([means[k] for k in range(len(means))]), labels


def initial_labels(
    models: torch.Tensor, k: int, pca: PCAMap | None, center: bool, seed: int, reduced: torch.Tensor | None = None
) -> np.ndarray:
    """R^0: k-means on unit-normalised reduced models, so Euclidean k-means follows the cosine."""
    points = reduce(pca, models, center) if reduced is None else reduced
    points = points / points.norm(dim=1, keepdim=True).clamp_min(1e-12)
    k = min(k, len(models))
    if k <= 1:
        return np.zeros(len(models), dtype=int)
    return kmeans(points.numpy(), k, seed, n_init=10).labels_


def member_weights(labels: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """A (K×n): row k holds the weights of cluster k's members, summing to 1 (Ω_k = A_k·X)."""
    labels = np.asarray(labels)
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype=float)
    k = int(labels.max()) + 1 if len(labels) else 0
    a = np.zeros((k, len(labels)))
    a[labels, np.arange(len(labels))] = w
    return a / np.maximum(a.sum(1, keepdims=True), 1e-300)


def _centre_distances(gram: np.ndarray, labels: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """‖ω_i − Ω_k‖² (n×K) and ‖Ω_k − Ω_l‖² (K×K) from the Gram matrix of the models."""
    a = member_weights(labels, weights)
    ga = gram @ a.T
    c = a @ ga
    to_centre = np.diag(gram)[:, None] - 2 * ga + np.diag(c)[None, :]
    between = np.diag(c)[:, None] + np.diag(c)[None, :] - 2 * c
    return np.clip(to_centre, 0.0, None), np.clip(between, 0.0, None)


def granularity(gram: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """G_c^k = Dist_intra^k / Dist_inter^k of every cluster (Alg. 3, lines 2–4).

    ``gram``: a Gram matrix of the models (any common centre); ``labels`` 0..K−1, the M-step's
    clusters, whose centres are the (``weights``-weighted) member means.
    """
    k = int(labels.max()) + 1
    if k < 2:
        return np.full(k, np.nan)
    to_centre, between = _centre_distances(gram, labels, weights)
    out = np.empty(k)
    for c in range(k):
        intra = float(to_centre[labels == c, c].mean())
        inter = float(between[c].sum() / (k - 1))  # the diagonal is 0
        out[c] = intra / inter if inter > 0 else np.inf
    return out


def tune_clusters(
    gram: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray | None,
    a: float,
    b: float,
    max_clusters: int,
    seed: int,
    dim: int | None = None,
) -> tuple[np.ndarray, dict]:
    """CNT (Alg. 3): merge clusters with G_c < a, split those with G_c > b; the new labels.

    ``gram``, ``labels``, ``weights`` as in :func:`granularity`; ``dim``: the models' dimension
    (for the split's k-means tolerance, ``clustering.kmeans``).
    """
    gc = granularity(gram, labels, weights)
    labels = labels.copy()
    merged: list[tuple[int, int]] = []
    split: list[int] = []
    if len(gc) >= 2:
        _, between = _centre_distances(gram, labels, weights)
        np.fill_diagonal(between, np.inf)
        touched: set[int] = set()
        for c in np.argsort(gc):  # tightest first
            if not gc[c] < a or c in touched:
                continue
            order = [int(j) for j in np.argsort(between[c], kind="stable") if int(j) not in touched and int(j) != c]
            if not order:
                continue
            target = order[0]
            labels[labels == c] = target
            touched |= {int(c), target}
            merged.append((int(c), target))
        count = len(np.unique(labels))
        next_label = int(labels.max()) + 1
        for c in np.argsort(-gc):  # widest first
            members = np.flatnonzero(labels == c)
            if not gc[c] > b or int(c) in touched or len(members) < 2 or count >= max_clusters:
                continue
            points = gram_coordinates(gram[np.ix_(members, members)])
            halves = kmeans(points, 2, seed, n_init=1, max_iter=1, dim=dim).labels_
            if halves.min() == halves.max():
                continue
            labels[members[halves == 1]] = next_label
            next_label += 1
            count += 1
            split.append(int(c))
    info = {"gc": [None if not np.isfinite(g) else round(float(g), 5) for g in gc], "merged": merged, "split": split}
    return labels, info


# --- the algorithm ----------------------------------------------------------------------------


class FedACServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.keys = float_keys(ctx.init_weights)
        self.body_keys = ctx.model().body_keys()
        self.phi: Tensors = {k: ctx.init_weights[k] for k in self.body_keys}
        self.known: list[int] = []  # clients with an uploaded model, in first-upload order
        self._rows = torch.empty(0, device="cpu")  # their last uploads, one flat float32 row each, spare rows at the end
        self._index: dict[int, int] = {}  # client -> row
        self.labels = np.zeros(0, dtype=int)  # cluster of each known client
        self.centres = torch.empty(0, device="cpu")  # Ω_k as flat rows
        self.pca: PCAMap | None = None
        self.population: Tensors | None = None  # mean of the known models (cached for a round)

    @property
    def models(self) -> torch.Tensor:
        """The known clients' last uploads (rows follow ``known``)."""
        return self._rows[: len(self.known)]

    def _as_model(self, row: torch.Tensor) -> Tensors:
        return self.ctx.init_weights | unflatten(row, self.ctx.init_weights, self.keys)

    def _anchor(self, cid: int) -> Tensors:
        """Ω_k*(i) of an assigned client; else the mean of the known models (or the initial one)."""
        if cid in self._index and len(self.centres):
            return self._as_model(self.centres[self.labels[self._index[cid]]])
        if not len(self.known):
            return dict(self.ctx.init_weights)
        if self.population is None:  # once per round, not once per unassigned client
            self.population = self._as_model(row_mean(self.models).to(torch.float32))
        return self.population

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FedACConfig = self.ctx.options
        phi = {GLOBAL + k: v for k, v in self.phi.items()}
        messages = {cid: Message("fit", self._anchor(cid) | phi) for cid in clients}
        phi_mean = WeightedMean()
        for cid, reply in comm.stream(messages):
            weight = reply.num_examples if opts.weighted else 1.0
            phi_mean.add({k: reply.tensors[k] for k in self.body_keys}, weight)
            self._store(cid, flatten(reply.tensors, self.keys))
        self.phi = phi_mean.result()
        self.population = None
        if len(self.centres) == 0 and len(self.known) < min(opts.num_clusters, self.ctx.config.clients_per_round):
            # R^0 of fewer models has fewer clusters (a lone one CNT never splits): wait for more uploads
            return

        seed = self.ctx.seed(rnd) % 2**31
        models = self.models
        refit = self.pca is None or (rnd - 1) % opts.pca_every == 0
        # One Gram matrix of the known models (minus the first) serves the PCA refit and CNT (module docstring).
        gram, reference = None, models[0].clone()
        if opts.cnt or (refit and opts.similarity == "lrcos"):
            gram = gram_matrix(models, reference)
        reduced = None  # the models' LrCos coordinates, when the refit gives them
        if refit:
            self.pca = None
            if opts.similarity == "lrcos":
                self.pca, scores = fit_map_scores(models, opts.pca_dims, gram, reference)
                if self.pca is not None and opts.pca_center:
                    reduced = scores
        if len(self.centres) == 0:
            labels = initial_labels(models, opts.num_clusters, self.pca, opts.pca_center, seed, reduced)
        else:
            labels = e_step(models, self.centres, opts.similarity, self.pca, opts.pca_center, reduced)
        weights = self.ctx.client_train_sizes[self.known] if opts.weighted else None
        self.labels = relabel(labels)
        info: dict = {}
        if opts.cnt:
            assert gram is not None
            self.labels, info = tune_clusters(
                gram, self.labels, weights, opts.gc_low, opts.gc_high, opts.max_clusters, seed, dim=models.shape[1]
            )
        self.centres, self.labels = m_step(models, self.labels, weights)
        pca = self.pca

        def points() -> torch.Tensor:  # the LrCos coordinates, for the log's 2-D view
            return reduce(pca, models, opts.pca_center) if pca is not None else models

        full = full_record(self.ctx.config, rnd)
        comm.log(clustering=cluster_record(self.known, self.labels, points, full=full, **info))

    def _store(self, cid: int, row: torch.Tensor) -> None:
        if cid in self._index:
            self._rows[self._index[cid]] = row
            return
        n = len(self.known)
        if n == len(self._rows):  # full: double the capacity (amortised O(1) copies per upload)
            grown = torch.empty(max(16, 2 * n), len(row), dtype=torch.float32, device="cpu")
            if n:
                grown[:n] = self._rows[:n]
            self._rows = grown
        self._rows[n] = row
        self.known.append(cid)
        self._index[cid] = n
        self.labels = np.append(self.labels, -1)  # assigned by this round's E-step

    def state_dict(self) -> dict:
        if len(self._rows) != len(self.known):  # drop the spare rows: a checkpoint holds the models only
            self._rows = self._rows[: len(self.known)].clone()
        return {
            "phi": self.phi,
            "known": list(self.known),
            "models": self._rows,
            "labels": self.labels,
            "centres": self.centres,
            "pca": self.pca,
        }

    def load_state_dict(self, state) -> None:
        self.phi, self.known = state["phi"], list(state["known"])
        self._rows = state["models"]
        self._index = {cid: i for i, cid in enumerate(self.known)}
        self.labels, self.centres = state["labels"], state["centres"]
        pca = state["pca"]
        if pca is not None and not isinstance(pca, dict):  # a checkpoint from before issue 21: a fitted sklearn PCA
            components = torch.from_numpy(pca.components_)
            reference = torch.from_numpy(pca.mean_).to(torch.float32)
            offset = (torch.from_numpy(pca.mean_) - reference.to(torch.float64)) @ components.T
            pca = {"reference": reference, "offset": offset, "components": components.to(torch.float32)}
        self.pca = pca
        self.population = None

    def evaluation_message(self, cid: int) -> Message:
        # A client that has uploaded keeps its personal model: nothing to send.
        if cid in self._index:
            return Message("evaluate", {})
        if self.ctx.options.first_start == "init":  # its ω_i^0, as it would start training from
            return Message("evaluate", dict(self.ctx.init_weights))
        return Message("evaluate", self._anchor(cid))


def regularizer(model: nn.Module, anchor: Tensors, phi: Tensors, mu: float, lam: float) -> ExtraLoss:
    """(μ/2)·‖ω − Ω‖² + (λ/2)·‖φ − Φ‖² over the parameters (the anchors looked up once)."""
    named = list(model.named_parameters())
    pull = [(p, anchor[n].to(p.dtype)) for n, p in named]
    body = [(p, phi[n].to(p.dtype)) for n, p in named if n in phi]

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        total = 0.5 * mu * sum((p - a).pow(2).sum() for p, a in pull)
        if lam:
            total = total + 0.5 * lam * sum((p - a).pow(2).sum() for p, a in body)
        return total

    return term


class FedACClient(PersonalClient):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedACConfig = ctx.options
        anchor = {k: v for k, v in msg.tensors.items() if not k.startswith(GLOBAL)}
        phi = {k[len(GLOBAL) :]: v for k, v in msg.tensors.items() if k.startswith(GLOBAL)}
        first = ctx.init_weights if opts.first_start == "init" else anchor  # ω_i^0 (see first_start)
        model = ctx.load(ctx.state.get("personal", first))
        ctx.train(hook=Term(regularizer(model, anchor, phi, opts.mu, opts.lam)))
        ctx.state["personal"] = ctx.weights()
        return ctx.reply(ctx.state["personal"])


FEDAC = Algorithm(
    name="fedac",
    summary="FedAC (Zhang et al. 2024): personal models pulled to a cluster centre and a global embedding; "
    "LrCos EM clustering with cluster number tuning",
    server=FedACServer,
    client=FedACClient,
    config=FedACConfig,
    reference=Reference("FedAC's paper (φ: all but the last layer)", head="last"),
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
