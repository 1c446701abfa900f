"""FL+HC: federated learning with hierarchical clustering of local updates.

Briggs, Fan and Andras, "Federated learning with hierarchical clustering of local updates to
improve training on non-IID data", IJCNN 2020 (arXiv:2004.11791, Algorithm 1). FedAvg runs
for n rounds (``cluster_round``); then every client trains the global model w^n for the run's
local epochs and sends its update

    Δw_i = w_i − w^n,

and agglomerative hierarchical clustering (scikit-learn) of the Δw_i, with a distance
``metric`` (Euclidean, cosine or Manhattan) and a ``linkage`` (Ward, average, complete or
single), cut at a ``distance_threshold`` (the paper's P) or into ``num_clusters`` clusters,
partitions the clients. From then on each cluster c trains its own model independently with
FedAvg, starting from w^n: in round t its sampled members train θ_c and

    θ_c ← Σ_{i∈S_t∩c} (n_i / n_{S_t∩c}) · w_i        (a cluster with no sampled member is kept).

The clustering runs on n coordinates with the updates' distances (:func:`update_points`: from
their Gram matrix, one n×n×d product; issue 21), which gives the same tree.

Rounds 1..n are FedAvg exactly. Before the clustering a client is evaluated with the global
model; afterwards with its cluster's model (every client has one: all clients are clustered).

Interpretations where the paper is silent (each a named option or noted here):

- The clustering happens at the end of round n = ``cluster_round``, after that round's FedAvg
  aggregation, through one extra exchange with all N clients (as the paper has every client
  send an update); rounds n+1, … train the clusters. The clustering updates are used only for
  the clustering: the cluster models start from w^n, as the paper writes. The default n = 10 is
  a choice here; the paper treats n as a hyperparameter.
- Ward's linkage is defined for Euclidean distances only, so it is rejected with another
  metric. Either ``num_clusters`` (default 5) or ``distance_threshold`` is used: giving a
  threshold alone switches ``num_clusters`` off; giving both is an error.
- After the clustering there is no global model: :meth:`global_weights` is None, so the global
  test split is no longer evaluated (``global_acc`` is null from round n on).
- From round n on every round logs ``clustering``; its full record (``log_clustering_every``)
  has the clustered clients, their cluster, and a 2-D PCA view of the clustering updates,
  computed once.

Missing replies (``--dropout``, rejected replies): a cluster none of whose sampled members
replied keeps its model. The clustering uses the clients that replied to the all-client
exchange; with fewer replies than ``num_clusters`` (or 2) the clustering is tried again at the
end of the next round (FedAvg goes on meanwhile). A client that did not reply then is clustered
when it first replies afterwards: it trains w^n like the others did, and joins the cluster whose
mean clustering update is nearest to its update under ``metric`` (that reply is used for the
assignment only, since it did not start from θ_c); until then it is evaluated with w^n.

Devices: the agglomerative clustering (scikit-learn) runs on the CPU, where the updates arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtail.algorithms.aggregate import PER_CLUSTER, WeightedMean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Comm, Message, Tensors
from fedtail.algorithms.clustering import (
    centred_gram,
    cluster_means,
    cluster_record,
    cosine_matrix,
    float_keys,
    flatten,
    full_record,
    gram,
    gram_coordinates,
    project_2d,
    relabel,
    server_threads,
)
from fedtail.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedtail.errors import ConfigError

if TYPE_CHECKING:
    from fedtail.engine.context import ServerContext


class FLHCConfig(AlgorithmConfig):
    cluster_round: int = Field(
        10, ge=1, description="n: FedAvg rounds; at the end of round n every client's update is clustered"
    )
    metric: Literal["euclidean", "cosine", "manhattan"] = Field("euclidean", description="distance between updates")
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="linkage of the agglomerative clustering (ward needs metric euclidean)"
    )
    num_clusters: int | None = Field(
        5, ge=1, description="cut the tree into this many clusters (null when distance_threshold is given)"
    )
    distance_threshold: float | None = Field(
        None, gt=0, description="P: cut the tree at this linkage distance instead of a cluster count"
    )

    @model_validator(mode="before")
    @classmethod
    def _threshold_replaces_count(cls, data: Any) -> Any:
        # A threshold given alone replaces the default cluster count.
        if isinstance(data, dict) and data.get("distance_threshold") is not None and "num_clusters" not in data:
            data = data | {"num_clusters": None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "FLHCConfig":
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError(
                f"--set flhc.linkage: ward linkage works only with metric euclidean (got metric {self.metric!r}); "
                "choose linkage average, complete or single"
            )
        if (self.num_clusters is None) == (self.distance_threshold is None):
            raise ValueError(
                "--set flhc.num_clusters: give exactly one of num_clusters and distance_threshold "
                f"(got num_clusters={self.num_clusters}, distance_threshold={self.distance_threshold})"
            )
        return self

    def check_run(self, num_clients: int) -> None:
        if self.num_clusters is not None and self.num_clusters > num_clients:
            raise ConfigError(
                f"--set flhc.num_clusters: {self.num_clusters} clusters cannot be formed from {num_clients} clients"
            )


def nearest(update: torch.Tensor, centroids: torch.Tensor, metric: str) -> int:
    """The cluster whose mean clustering update is nearest to ``update`` under ``metric``."""
    u, c = update.to(torch.float64)[None], centroids.to(torch.float64)
    if metric == "cosine":
        return int(cosine_matrix(u, c).argmax())
    return int(torch.cdist(u, c, p=1.0 if metric == "manhattan" else 2.0).argmin())


def update_points(updates: torch.Tensor, metric: str) -> np.ndarray:
    """Points with the updates' geometry under ``metric``, in at most n coordinates (float64).

    Euclidean distances are those of the Gram coordinates of the centred updates, cosine
    distances those of the uncentred ones (inner products preserved); Ward, average, complete and
    single linkage depend on the distances only, so the tree is the same as on the updates
    (``clustering.gram_coordinates``). Manhattan distances change under rotation: the updates
    themselves (float64).
    """
    if metric == "manhattan" or updates.shape[1] <= len(updates):
        return updates.to(torch.float64).numpy()
    return gram_coordinates(centred_gram(updates) if metric == "euclidean" else gram(updates))


def hierarchical_clusters(
    updates: torch.Tensor,
    metric: str,
    linkage: str,
    num_clusters: int | None,
    distance_threshold: float | None,
    points: np.ndarray | None = None,
) -> np.ndarray:
    """Agglomerative clustering of the rows, labels renumbered 0..K−1 by first appearance.

    ``points``: :func:`update_points` of the rows, if already computed.
    """
    if len(updates) < 2:
        return np.zeros(len(updates), dtype=int)
    from sklearn.cluster import AgglomerativeClustering  # here, not at the top: seconds off every process start

    model = AgglomerativeClustering(
        n_clusters=num_clusters, distance_threshold=distance_threshold, metric=metric, linkage=linkage
    )
    with server_threads():
        return relabel(model.fit_predict(update_points(updates, metric) if points is None else points))


class FLHCServer(FedAvgServer):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.labels: list[int] | None = None  # every client's cluster once clustered (-1: not yet)
        self.clusters: list[Tensors] = []  # θ_c
        self.centroids: torch.Tensor | None = None  # mean clustering update of each cluster
        self.view: list[list[float]] = []  # 2-D PCA of the clustering updates (for the log)

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FLHCConfig = self.ctx.options
        if self.labels is None:
            super().run_round(rnd, clients, comm)  # FedAvg, exactly
            if rnd >= opts.cluster_round:
                self.cluster(comm)
        else:
            self.train_clusters(clients, comm)
        if self.labels is not None:
            assigned = [cid for cid, label in enumerate(self.labels) if label >= 0]
            labels = [self.labels[cid] for cid in assigned]
            full = full_record(self.ctx.config, rnd)
            view = self.view if len(self.view) == len(assigned) else None  # late joiners have no point in it
            comm.log(clustering=cluster_record(assigned, labels, full=full, view=view))

    def cluster(self, comm: Comm) -> None:
        """Every client trains w^n and sends Δw_i; the clusters all start from w^n."""
        opts: FLHCConfig = self.ctx.options
        keys = float_keys(self.weights)
        origin = flatten(self.weights, keys)
        messages = {cid: Message("fit", self.weights) for cid in range(self.ctx.num_clients)}
        rows = {cid: flatten(reply.tensors, keys) - origin for cid, reply in comm.stream(messages)}
        if len(rows) < max(2, opts.num_clusters or 2):
            return  # too few replies to cluster: FedAvg goes on, and the clustering is tried again
        updates = torch.stack(list(rows.values()))  # client-id order
        points = update_points(updates, opts.metric)
        labels = hierarchical_clusters(
            updates, opts.metric, opts.linkage, opts.num_clusters, opts.distance_threshold, points
        )
        self.labels = [-1] * self.ctx.num_clients
        for cid, label in zip(rows, labels):
            self.labels[cid] = int(label)
        means = cluster_means(updates, labels)
        self.centroids = torch.stack([means[c] for c in range(len(means))])
        self.clusters = [dict(self.weights) for _ in range(int(labels.max()) + 1)]
        self.view = project_2d(points)  # the same PCA scores as of the updates (rotation, translation)

    def train_clusters(self, clients: list[int], comm: Comm) -> None:
        assert self.labels is not None and self.centroids is not None
        means: dict[int, WeightedMean] = {}
        keys = float_keys(self.weights)
        # a client not clustered yet trains w^n; its update picks its cluster
        messages = {cid: Message("fit", self.evaluation_message(cid).tensors) for cid in clients}
        for cid, reply in comm.stream(messages):
            if self.labels[cid] < 0:
                update = flatten(reply.tensors, keys) - flatten(self.weights, keys)
                self.labels[cid] = nearest(update, self.centroids, self.ctx.options.metric)
            else:
                means.setdefault(self.labels[cid], WeightedMean()).add(reply.tensors, reply.num_examples)
        for c, mean in means.items():
            self.clusters[c] = mean.result()

    def global_weights(self) -> Tensors | None:
        return self.weights if self.labels is None else None

    def evaluation_message(self, cid: int) -> Message:
        if self.labels is None or self.labels[cid] < 0:
            return Message("evaluate", self.weights)
        return Message("evaluate", self.clusters[self.labels[cid]])


FLHC = Algorithm(
    name="flhc",
    summary="FL+HC (Briggs et al. 2020): FedAvg, then one agglomerative clustering of all clients' updates; "
    "FedAvg within each cluster",
    server=FLHCServer,
    client=FedAvgClient,
    config=FLHCConfig,
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
