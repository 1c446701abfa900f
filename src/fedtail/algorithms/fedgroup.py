"""FedGroup: clustered FL by the decomposed cosine similarity of the clients' update directions.

Duan, Liu, Ji, Liu, Liang, Chen and Tan, "FedGroup: Efficient Federated Learning via Decomposed
Similarity-Based Clustering", ISPA 2021 (arXiv:2010.06870). Clients are grouped once, by the
direction of their local updates; each group then trains one shared model with FedAvg.

Group cold start (once, in round 1). A set P of clients (``pretrain_clients``; the paper: α·K)
trains from the common initial model w⁰ and uploads Δw_i = w_i − w⁰. With ΔW the |P|×d matrix of
the flattened updates, a truncated SVD gives m directions v_1..v_m (``svd_dims``, the top right
singular vectors, exact: see the interpretations below), and each client becomes the vector of its
decomposed cosine similarities

    s_i = (cos(Δw_i, v_1), …, cos(Δw_i, v_m)),      EDC(i, j) = ‖s_i − s_j‖₂.

K-means (scikit-learn) with K = ``num_groups`` on the s_i (Euclidean, i.e. on EDC) gives the
groups. Group g starts from the plain mean of its members' models θ_g = w⁰ + mean_{i∈g} Δw_i
(``group_init=init``: from w⁰), and keeps its centre update direction c_g = mean_{i∈g} Δw_i.

Newcomer cold start. A client sampled for the first time (not in P) trains from the start model
(``newcomer_start``: w⁰ or the auxiliary global model) and joins
g(i) = argmax_g cos(Δw_i, r_g), with r_g = c_g when it started from w⁰, or r_g = the group's
latest update θ_g^t − θ_g^{t−1} (c_g until the group changed) when it started from the
auxiliary global model, as the authors' code does.

Group training, each round: a sampled client trains its group's model θ_g (FedGrouProx: with
the proximal term (μ/2)·‖w − θ_g‖², ``mu``; 0 is FedGroup) and the server averages within
each group, weighted by sample counts,

    θ_g ← Σ_{i∈S_t∩g} (n_i / n_{S_t∩g}) · w_i        (groups with no sampled member are kept).

Optional inter-group aggregation with the inter-group learning rate η_g (``eta_g``; 0: off), in
the form of the authors' released code (the equation of the ISPA text could not be checked):

    θ_g ← (θ_g + Σ_{j≠g} (η_g / ‖θ_j‖) · θ_j) / (1 + Σ_{j≠g} η_g / ‖θ_j‖).

The auxiliary global model is the plain mean of the group models (w⁰ before the groups exist):
it is :meth:`global_weights` and what a client never assigned to a group is evaluated with; an
assigned client is evaluated with its group's model.

Interpretations where the paper is silent (each a named option or noted here):

- ``pretrain_clients`` null is min(α·K, N) with α = 20, the value in the authors' code; a value
  ≤ 1 is a fraction of the N clients, a larger whole number a count. P is drawn from all clients
  with the run's seed. Pre-training is plain local training (no proximal term) for the run's
  local epochs. Pre-trained clients keep their group.
- Cold starts are extra exchanges in the round that needs them: in round 1 the clients of P
  pre-train, then that round's newcomers cold-start, then the sampled clients train their groups
  (so a sampled client may train twice in the round it is first seen).
- m is capped at |P| (ΔW has rank ≤ |P|). The SVD is exact, from the |P|×|P| Gram matrix
  G = ΔW ΔWᵀ = U Σ² Uᵀ: v_k = ΔWᵀ u_k / σ_k and cos(Δw_i, v_k) = σ_k·u_ik / ‖Δw_i‖ (issue 21:
  one |P|×|P|×d product). Earlier versions used TruncatedSVD's seeded randomized solver, an
  approximation of the same vectors; the groups agree on separated updates (tests).
  The sign of a singular vector is arbitrary; flipping it flips one coordinate of every s_i,
  which leaves EDC unchanged. The authors' code maps the similarities to (1 − s)/2 before
  k-means; that only halves every distance, so the plain cosines are used.
- Defaults K = 5 and m = 3 are those of the authors' code; η_g = 0 and μ = 0 give plain FedGroup.
- The group means at cold start are plain (unweighted) means, as in the authors' code; the
  auxiliary global model is the plain mean of the group models.
- Integer buffers (BatchNorm's ``num_batches_tracked``) of a group model formed at cold start
  are taken from the start model; they carry no information the training uses.
- Every round logs ``clustering`` with the round's newcomers (and, in round 1, the pre-trained
  set P); its full record (``log_clustering_every``) adds all assigned clients with their group
  and their decomposed similarity vectors s_i as the points of the scatter (a newcomer's s_i
  uses the same v_k).

Missing replies (``--dropout``, rejected replies): a group none of whose sampled members replied
keeps its model (and its latest update direction). The groups are formed from the members of P
that replied, once at least K did (until then the group cold start is tried again each round and
nothing else happens). A client whose cold start got no reply stays a newcomer and is not sent a
group model that round. Each cold start is an exchange of its own: a round in which all of P, or
all of the round's newcomers, fail is ended and undone by the engine, even if grouped clients
were alive.

Devices: EDC (the SVD of the updates' Gram matrix, k-means) runs on the CPU, where the uploads
arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from fedtail.algorithms.aggregate import PER_CLUSTER, WeightedMean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, Comm, Message, ServerHalf, Tensors
from fedtail.algorithms.base import Term
from fedtail.algorithms.clustering import (
    BLOCK_VALUES,
    EIG_RTOL,
    cluster_means,
    cluster_record,
    cosine_matrix,
    float_keys,
    flatten,
    full_record,
    gram,
    kmeans,
    relabel,
    server_threads,
    unflatten,
)
from fedtail.algorithms.fedprox import proximal_term
from fedtail.errors import ConfigError

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext

ALPHA = 20  # pre-training scale α of the authors' code: α·K clients pre-train


class FedGroupConfig(AlgorithmConfig):
    num_groups: int = Field(5, ge=2, description="K: number of groups (k-means clusters)")
    svd_dims: int = Field(3, ge=1, description="m: SVD directions of the decomposed similarity (authors' code: 3)")
    pretrain_clients: float | None = Field(
        None,
        gt=0,
        description="clients pre-trained for the group cold start: a fraction of all clients if <= 1, "
        "else a count (null: min(20·num_groups, all clients), α = 20 as in the authors' code)",
    )
    group_init: Literal["members", "init"] = Field(
        "members", description="a group model starts as its members' mean pre-trained model, or as the initial model"
    )
    newcomer_start: Literal["init", "global_mean"] = Field(
        "init",
        description="a newcomer's cold-start training starts from the initial model (compared with the groups' "
        "pre-training centres) or from the auxiliary global model (compared with the groups' latest updates)",
    )
    eta_g: float = Field(0.0, ge=0, description="η_g: inter-group learning rate (0: no inter-group aggregation)")
    mu: float = Field(0.0, ge=0, description="FedGrouProx: μ of the pull towards the group model (0: FedGroup)")

    @field_validator("pretrain_clients")
    @classmethod
    def _count_is_whole(cls, v: float | None) -> float | None:
        if v is not None and v > 1 and v != int(v):
            raise ValueError("a value above 1 is a count of clients and must be a whole number")
        return v

    def check_run(self, num_clients: int) -> None:
        pretrain_count(self.pretrain_clients, self.num_groups, num_clients)


def pretrain_count(option: float | None, num_groups: int, num_clients: int) -> int:
    """|P|: how many clients pre-train for the group cold start (see ``pretrain_clients``)."""
    if option is None:
        n = min(ALPHA * num_groups, num_clients)
    elif option <= 1:
        n = round(option * num_clients)
    else:
        n = int(option)
    if not num_groups <= n <= num_clients:
        raise ConfigError(
            f"--set fedgroup.pretrain_clients: {n} pre-training clients cannot form {num_groups} groups "
            f"(num_groups) out of {num_clients} clients; need num_groups <= pre-training clients <= clients"
        )
    return n


# --- the server's steps, on flat update vectors (rows) -----------------------------------------


def _svd(updates: torch.Tensor, dims: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(σ_k, u_k, G) of the top m = min(dims, rows) singular triplets of ΔW, from G = ΔW ΔWᵀ."""
    g = gram(updates)
    with server_threads():
        w, u = np.linalg.eigh(g)
    top = np.arange(len(g) - 1, -1, -1)[: min(dims, len(g))]
    # a direction of zero singular value is no direction of the updates: its cosines are 0
    sigma = np.sqrt(np.where(w[top] > EIG_RTOL * max(float(w[-1]), 0.0), w[top], 0.0))
    return sigma, u[:, top], g


def _directions(updates: torch.Tensor, sigma: np.ndarray, u: np.ndarray) -> torch.Tensor:
    """v_k = ΔWᵀ u_k / σ_k as rows (float64; zero where σ_k = 0), by column blocks."""
    coef = torch.from_numpy((u / np.where(sigma > 0, sigma, np.inf)).T.astype(np.float32))
    out = torch.empty(len(sigma), updates.shape[1], dtype=torch.float64, device=updates.device)
    width = max(1, BLOCK_VALUES // max(len(updates), 1))
    for a in range(0, updates.shape[1], width):
        out[:, a : a + width] = coef @ updates[:, a : a + width].to(torch.float32)
    return out


def svd_directions(updates: torch.Tensor, dims: int, seed: int | None = None) -> torch.Tensor:
    """v_1..v_m: the top right singular vectors of ΔW (one row each, float64), m ≤ rows; exact (``seed`` unused)."""
    sigma, u, _ = _svd(updates, dims)
    return _directions(updates, sigma, u)


def decomposed_similarity(updates: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """s_i = (cos(Δw_i, v_k))_k for every row: the points whose distances are EDC."""
    return cosine_matrix(updates, directions)


def edc(updates: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """EDC(i, j) = ‖s_i − s_j‖₂ for every pair of rows."""
    s = decomposed_similarity(updates, directions)
    return torch.cdist(s, s)


def edc_groups(updates: torch.Tensor, k: int, dims: int, seed: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Group cold start: k-means on the decomposed similarities; (labels, s_i rows, directions).

    s_ik = cos(Δw_i, v_k) = σ_k·u_ik / ‖Δw_i‖, read off the Gram matrix the SVD came from.
    """
    sigma, u, g = _svd(updates, dims)
    norms = np.sqrt(np.clip(np.diag(g), 0.0, None))
    points = torch.from_numpy(u * sigma / np.maximum(norms, 1e-12)[:, None])
    labels = kmeans(points.numpy(), k, seed, n_init=10).labels_
    return relabel(labels), points, _directions(updates, sigma, u)


def most_similar(updates: torch.Tensor, references: torch.Tensor) -> np.ndarray:
    """Newcomer cold start: for each row, the reference direction with the largest cosine."""
    return cosine_matrix(updates, references).argmax(dim=1).numpy()


def inter_group_mix(models: torch.Tensor, eta: float) -> torch.Tensor:
    """θ_g ← (θ_g + Σ_{j≠g} (η/‖θ_j‖)·θ_j) / (1 + Σ_{j≠g} η/‖θ_j‖) for every row (float64)."""
    x = models.to(torch.float64)
    weights = (eta / x.norm(dim=1).clamp_min(1e-12)).expand(len(x), len(x)).clone()
    weights.fill_diagonal_(1.0)
    return (weights @ x) / weights.sum(dim=1, keepdim=True)


# --- the algorithm ----------------------------------------------------------------------------


class FedGroupServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: FedGroupConfig = ctx.options
        self.num_pretrain = pretrain_count(opts.pretrain_clients, opts.num_groups, ctx.num_clients)
        self.keys = float_keys(ctx.init_weights)
        self.groups: list[Tensors] = []  # θ_g; empty until the group cold start
        self.centres = torch.empty(0, device="cpu")  # c_g: mean pre-training update of each group (rows)
        self.latest = torch.empty(0, device="cpu")  # the latest change of each group model (rows)
        self.directions = torch.empty(0, device="cpu")  # v_1..v_m of the group cold start (rows)
        self.group_of: dict[int, int] = {}
        self.points: dict[int, list[float]] = {}  # s_i of every assigned client (for the log)
        self.aux: Tensors = dict(ctx.init_weights)  # the auxiliary global model

    # -- models ----------------------------------------------------------------------------
    def _as_model(self, row: torch.Tensor, template: Tensors) -> Tensors:
        return template | unflatten(row, template, self.keys)

    def _refresh_auxiliary(self) -> None:
        """The auxiliary global model: the plain mean of the group models."""
        mean = WeightedMean(plain=True)  # of the server's own models, never the run's rule
        for model in self.groups:
            mean.add(model, 1.0)
        self.aux = mean.result()

    def global_weights(self) -> Tensors:
        return self.aux

    def evaluation_message(self, cid: int) -> Message:
        g = self.group_of.get(cid)
        return Message("evaluate", self.groups[g] if g is not None else self.aux)

    # -- one round -------------------------------------------------------------------------
    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        log: dict = {}
        if not self.groups:
            log["pretrained"] = self.group_cold_start(comm)
            if not self.groups:  # too few pre-training replies to form the groups: again next round
                return
        newcomers = [cid for cid in clients if cid not in self.group_of]
        if newcomers:
            newcomers = self.newcomer_cold_start(newcomers, comm)
        self.train_groups(clients, comm)
        assigned = sorted(self.group_of)
        labels = [self.group_of[c] for c in assigned]
        points = np.array([self.points[c] for c in assigned])
        full = full_record(self.ctx.config, rnd)
        comm.log(clustering=cluster_record(assigned, labels, points, full=full, newcomers=newcomers, **log))

    def _updates(self, cids: list[int], start: Tensors, comm: Comm) -> tuple[list[int], torch.Tensor]:
        """The clients that replied and their rows Δw_i = w_i − start, after cold-start training from ``start``."""
        origin = flatten(start, self.keys)
        messages = {cid: Message("pretrain", start) for cid in cids}
        rows = {cid: flatten(reply.tensors, self.keys) - origin for cid, reply in comm.stream(messages)}
        return sorted(rows), torch.stack([rows[cid] for cid in sorted(rows)])

    def group_cold_start(self, comm: Comm) -> list[int]:
        opts: FedGroupConfig = self.ctx.options
        rng = np.random.default_rng(self.ctx.seed(0xF6, 1))
        chosen = sorted(int(c) for c in rng.choice(self.ctx.num_clients, size=self.num_pretrain, replace=False))
        init = self.ctx.init_weights
        chosen, updates = self._updates(chosen, init, comm)
        if len(chosen) < opts.num_groups:
            return chosen
        labels, points, self.directions = edc_groups(
            updates, opts.num_groups, opts.svd_dims, self.ctx.seed(0xF6, 2) % 2**31
        )
        means = cluster_means(updates, labels)  # plain means, as in the authors' code
        self.centres = torch.stack([means[g] for g in range(len(means))])
        self.latest = self.centres.clone()
        origin = flatten(init, self.keys)
        for centre in self.centres:
            self.groups.append(self._as_model(origin + centre, init) if opts.group_init == "members" else dict(init))
        for cid, g, s in zip(chosen, labels, points):
            self.group_of[cid] = int(g)
            self.points[cid] = s.tolist()
        self._refresh_auxiliary()
        return chosen

    def newcomer_cold_start(self, newcomers: list[int], comm: Comm) -> list[int]:
        """Group the newcomers by their cold-start update; returns those that replied (now grouped)."""
        opts: FedGroupConfig = self.ctx.options
        from_init = opts.newcomer_start == "init"
        start = self.ctx.init_weights if from_init else self.aux
        newcomers, updates = self._updates(newcomers, start, comm)
        groups = most_similar(updates, self.centres if from_init else self.latest)
        points = decomposed_similarity(updates, self.directions)
        for cid, g, s in zip(newcomers, groups, points):
            self.group_of[cid] = int(g)
            self.points[cid] = s.tolist()
        return newcomers

    def train_groups(self, clients: list[int], comm: Comm) -> None:
        opts: FedGroupConfig = self.ctx.options
        means: dict[int, WeightedMean] = {}
        # clients whose cold start got no reply have no group yet: they are newcomers next time
        messages = {cid: Message("fit", self.groups[self.group_of[cid]]) for cid in clients if cid in self.group_of}
        if not messages:
            return
        for cid, reply in comm.stream(messages):
            means.setdefault(self.group_of[cid], WeightedMean()).add(reply.tensors, reply.num_examples)
        before = torch.stack([flatten(model, self.keys) for model in self.groups])
        for g, mean in means.items():
            self.groups[g] = mean.result()
        if opts.eta_g > 0 and len(self.groups) > 1:
            mixed = inter_group_mix(torch.stack([flatten(model, self.keys) for model in self.groups]), opts.eta_g)
            self.groups = [self._as_model(row, model) for row, model in zip(mixed, self.groups)]
        after = torch.stack([flatten(model, self.keys) for model in self.groups])
        changed = (after != before).any(dim=1)
        self.latest[changed] = (after - before)[changed]  # a group no one trained keeps its last direction
        self._refresh_auxiliary()


class FedGroupClient(ClientHalf):
    def pretrain(self, msg: Message, ctx: ClientContext) -> Message:
        """Cold start: plain local training from the start model; the server takes the update."""
        ctx.load(msg.tensors)
        ctx.train()
        return ctx.reply(ctx.weights())

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedGroupConfig = ctx.options
        model = ctx.load(msg.tensors)
        # msg.tensors is θ_g itself: load() copied it into the model, so it stays fixed as the anchor.
        ctx.train(hook=Term(proximal_term(model, msg.tensors, opts.mu)) if opts.mu > 0 else None)
        return ctx.reply(ctx.weights())


FEDGROUP = Algorithm(
    name="fedgroup",
    summary="FedGroup (Duan et al. 2021): static groups by k-means on the decomposed cosine similarity (EDC) "
    "of update directions, newcomer cold start, FedAvg within groups",
    server=FedGroupServer,
    client=FedGroupClient,
    config=FedGroupConfig,
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
