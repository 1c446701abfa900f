"""FeSEM: Federated Stochastic Expectation Maximization (multi-center federated learning).

Long, Xie, Shen, Zhou, Wang and Jiang, "Multi-center federated learning: clients clustering for
better personalization", World Wide Web 26 (2023), online 2022 (Algorithm 1). The server keeps K
centres Ω_1..Ω_K (whole models) and minimises the multi-center federated loss

    L = (1/m) Σ_i Σ_k r_i^(k) · ‖ω_i − Ω_k‖²

over the assignment r and the centres, alternating with local training:

    local update: client i starts from its centre Ω_{k(i)} and trains E epochs, giving ω_i;
    E-step:       r_i^(k) = 1 iff k = argmin_j ‖ω_i − Ω_j‖²
    M-step:       Ω_k = Σ_i r_i^(k) ω_i / Σ_i r_i^(k)

One E-step and one M-step per round, as Algorithm 1 alternates them with the local update.
Models are compared as flat vectors of their floating-point tensors (``clustering.flatten``);
the E-step's distances are float64 by blocks of rows, the k-means++ seeding runs on the rows'
Gram coordinates (the same draws: :mod:`fedtail.algorithms.clustering`).
There is one shared model per cluster and no personal model: a client is evaluated with its
centre. There is no global model.

Interpretations where the paper is silent (options, or noted here):

- With client sampling, the server keeps every client's last uploaded ω_i, and the E-step runs
  over every client seen so far (Algorithm 1 writes it over all clients i). Ties go to the
  lowest k.
- ``m_step``: which members' models make a centre. ``all``: every member's last upload, stale
  ones included (Algorithm 1's sum over all clients i, read literally under sampling). ``round``:
  only the members trained this round, as the authors' code sets each centre to the average of
  the cluster's clients that trained in the round (stale models enter only its clustering). With
  25 % of the clients a round, ``all`` averages mostly models trained from older centres, so the
  centres move a fraction of what the round's training moved them. Either way a cluster without
  (fresh) members keeps its centre.
- The M-step is the paper's plain mean; ``weighted=true`` weights the members by their
  training-set sizes (with K = 1 and every client sampled, that is FedAvg exactly).
- ``init``: how the K centres start is not specified in what we could check of the paper.
  ``random``: K independent random initialisations of the architecture, centre 0 being the run's
  common initial model (IFCA's starting models; FedGroup's reimplementation of FeSEM also starts
  from K random initialisations). ``first-round``: clients train the common initial model until
  min(K, clients) different clients have uploaded (round 1 when a round samples at least K), and
  the centres are K of those models picked by k-means++ seeding (scikit-learn), then that round's
  E- and M-steps run as usual. ``common``: all K centres are the run's initial model, as the
  authors' code starts them, and every client keeps its random cold-start centre (below) until
  each centre has been built by an M-step from members of its own; the E-steps start in the
  round after. The authors' code trains every cluster in every round (it samples clients per
  cluster), so its first re-clustering also sees K trained centres. Running E-steps from round 2,
  as an earlier version did, compared the clients with the centres built in round 1 and with the
  untouched copies of the initial model, which all tie, so only the lowest of those copies could
  win members: with K 40 and 25 clients a round only 26 centres were ever used. Needs
  ``cold_start=random`` (with identical centres a choice by loss always picks the first).
- ``cold_start``: a client with no uploaded model yet has no assignment. ``random``: it belongs to
  a fixed random cluster, drawn once for all clients from the run seed as a balanced permutation
  (the multi-center-fed-learning code released with the paper's arXiv version also starts from
  a random assignment). ``loss``: it receives all K centres and starts from, or is evaluated
  with, the one of lowest training loss (IFCA's rule; K models on the downlink, metered). Its
  first upload then gets it an assignment.
- Defaults: ``init=first-round``, ``cold_start=loss`` and ``m_step=all`` (the behaviour before
  the option existed); the reference (``fedtail list``) a new run gets is the authors' code's
  ``init=common`` with ``cold_start=random`` (their first clustering is a random assignment of
  the clients to K copies of one model) and ``m_step=round``. Under ``init=random`` a locally
  trained model stays far nearer the centre it started from than any other random
  initialisation, so the E-step never moves a client (seen in small runs) and FeSEM would
  reduce to a fixed random partition; from round-1 models the E-step does move clients.
- Integer buffers (BatchNorm's ``num_batches_tracked``) are not part of the vectors; the centres
  carry the common initial model's values for them.

Missing replies (``--dropout``, rejected replies): a client that did not reply keeps its last
upload (or stays unassigned), as a client not sampled; the E-step runs over the uploads kept, the
M-step over those or (``m_step=round``) over the round's replies, and a centre left without
members keeps its value. Under ``init=first-round`` the centres
are seeded at the end of the first round by which min(K, clients) clients have uploaded; until
then clients train the initial model and nothing is clustered or logged. (Seeding as soon as one
round's clients had uploaded left K − clients-per-round centres as random initialisations, far
from every trained model, so they never won a member.)

Devices: the E- and M-steps (distances on the Gram matrix, k-means++) run on the CPU, where the
uploads arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtail.algorithms.aggregate import PER_CLUSTER
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Comm, Message, Reference, ServerHalf, Tensors
from fedtail.algorithms.clustering import (
    centred_gram,
    cluster_means,
    cluster_record,
    flatten,
    float_keys,
    full_record,
    gram_coordinates,
    server_threads,
    squared_distances,
    unflatten,
)
from fedtail.algorithms.ifca import IFCAClient, initial_cluster_models, pack_models, random_init_weights

if TYPE_CHECKING:
    from fedtail.engine.context import ServerContext


class FeSEMConfig(AlgorithmConfig):
    num_clusters: int = Field(2, ge=1, description="K: number of centres")
    init: Literal["random", "first-round", "common"] = Field(
        "first-round",
        description="centres start as K random initialisations (centre 0: the run's initial model), "
        "as K of the first trained models (k-means++ seeding), or all as the run's initial model "
        "(the first assignment: the cold start's)",
    )
    cold_start: Literal["random", "loss"] = Field(
        "loss",
        description="a client never assigned uses a fixed random centre, or the centre of lowest training loss",
    )
    weighted: bool = Field(False, description="sample-weighted M-step (the paper: plain mean of the members)")
    m_step: Literal["all", "round"] = Field(
        "all",
        description="a centre is the mean of its members' last uploads (every client seen so far), or of "
        "the members trained this round (the authors' code)",
    )

    @model_validator(mode="after")
    def _check(self) -> FeSEMConfig:
        if self.init == "common" and self.cold_start == "loss" and self.num_clusters > 1:
            raise ValueError(
                "init=common needs cold_start=random: K identical centres tie on every loss, so every "
                "client would pick the first and the others would never be built"
            )
        return self


# --- the server's EM steps, on flat model vectors (rows) --------------------------------------


def e_step(models: torch.Tensor, centres: torch.Tensor) -> np.ndarray:
    """r_i = argmin_k ‖ω_i − Ω_k‖² for each row ω_i (ties: the lowest k)."""
    return squared_distances(models, centres).argmin(dim=1).numpy()


def m_step(
    models: torch.Tensor, labels: np.ndarray, centres: torch.Tensor, weights: np.ndarray | None = None
) -> torch.Tensor:
    """Ω_k = mean of the rows labelled k (``weights``: weighted); empty clusters keep their centre."""
    new = centres.clone()
    for k, mean in cluster_means(models, labels, weights).items():
        new[k] = mean
    return new


def seeded_centres(models: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """Up to ``count`` of the rows, picked by k-means++ seeding (fewer if there are fewer rows).

    k-means++ draws by squared distances only, so it runs on the rows' Gram coordinates
    (``clustering.gram_coordinates``, n numbers per row instead of d): the same draws, the same rows.
    """
    from sklearn.cluster import kmeans_plusplus  # here, not at the top: seconds off every process start

    n = min(count, len(models))
    with server_threads():
        _, picked = kmeans_plusplus(gram_coordinates(centred_gram(models)), n_clusters=n, random_state=seed)
    return models[torch.as_tensor(picked, device=models.device)].clone()


# --- the server half ---------------------------------------------------------------------------


class FeSEMServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: FeSEMConfig = ctx.options
        self.keys = float_keys(ctx.init_weights)
        self.centres: torch.Tensor | None = None  # K x D; None until round 1 under init=first-round
        if opts.init != "first-round":
            models = initial_cluster_models(ctx, opts.num_clusters, random=opts.init == "random")
            self.centres = self._flat(models)
        # under init=common, centres that are still copies of the initial model (no M-step has
        # given them members): while any is left, every client keeps its random first centre
        self.unbuilt: set[int] = set(range(opts.num_clusters)) if opts.init == "common" else set()
        self.models: dict[int, torch.Tensor] = {}  # each client's last uploaded ω_i (flat)
        self.labels: dict[int, int] = {}  # the E-step's assignment of the clients in ``models``
        rng = np.random.default_rng(ctx.seed(0xFE5E))
        self.cold_labels = rng.permutation(ctx.num_clients) % opts.num_clusters

    def _flat(self, models: list[Tensors]) -> torch.Tensor:
        return torch.stack([flatten(m, self.keys) for m in models])

    def _weights(self, vector: torch.Tensor) -> Tensors:
        """A full state dict: the vector's float tensors, the initial model's integer buffers."""
        template = self.ctx.init_weights
        return template | unflatten(vector, template, self.keys)

    def _message(self, cid: int, kind: str) -> Message:
        opts: FeSEMConfig = self.ctx.options
        if self.centres is None:  # round 1 under init=first-round
            return Message(kind, dict(self.ctx.init_weights))
        if cid in self.labels:
            return Message(kind, self._weights(self.centres[self.labels[cid]]))
        if opts.cold_start == "loss":
            return pack_models([self._weights(c) for c in self.centres], kind=kind)
        return Message(kind, self._weights(self.centres[self.cold_labels[cid]]))

    def _first_centres(self, models: torch.Tensor, rnd: int) -> torch.Tensor:
        count = self.ctx.options.num_clusters
        picked = seeded_centres(models, count, self.ctx.seed(0xFE5E, rnd) % 2**31)
        extra = [random_init_weights(self.ctx, k) for k in range(len(picked), count)]
        return torch.cat([picked, self._flat(extra)]) if extra else picked

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FeSEMConfig = self.ctx.options
        fresh: list[int] = []  # the clients that trained this round
        for cid, reply in comm.stream({cid: self._message(cid, "fit") for cid in clients}):
            self.models[cid] = flatten(reply.tensors, self.keys)
            fresh.append(cid)
        if self.centres is None and len(self.models) < min(opts.num_clusters, self.ctx.num_clients):
            # seeded now, some centres would be random initialisations where trained models will do
            return
        cids = sorted(self.models)
        models = torch.stack([self.models[c] for c in cids])
        if self.centres is None:
            self.centres = self._first_centres(models, rnd)
        if self.unbuilt:  # copies of the initial model tie on every distance: no E-step yet
            labels = self.cold_labels[cids]  # init=common implies cold_start=random
        else:
            labels = e_step(models, self.centres)
        members = np.arange(len(cids)) if opts.m_step == "all" else np.flatnonzero(np.isin(cids, fresh))
        weights = self.ctx.client_train_sizes[np.asarray(cids)[members]] if opts.weighted else None
        self.centres = m_step(models[torch.as_tensor(members, device=models.device)], labels[members], self.centres, weights)
        self.unbuilt -= set(labels[members].tolist())
        self.labels = {c: int(k) for c, k in zip(cids, labels)}
        comm.log(clustering=cluster_record(cids, labels, models, full=full_record(self.ctx.config, rnd)))

    def evaluation_message(self, cid: int) -> Message:
        return self._message(cid, "evaluate")


FESEM = Algorithm(
    name="fesem",
    summary="FeSEM (Long et al. 2022): K centres; clients assigned to the nearest centre (L2), centres = member means",
    server=FeSEMServer,
    # The client trains the centre it receives (or, for a cold start by loss, the best of the K).
    client=IFCAClient,
    config=FeSEMConfig,
    reference=Reference(
        "the authors' code (multi-center-fed-learning)",
        options={"init": "common", "cold_start": "random", "m_step": "round"},
    ),
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
