"""CGPFL: Personalized Federated Learning with Contextualized Generalization.

Tang, Guo and Guo, IJCAI 2022 (a baseline of FedAC: the FedAC paper, Sec. 2.2 and 5.2). CGPFL is pFedMe's
bi-level (Moreau-envelope) scheme with K "contextualized generalized" models ω_1..ω_K on the server
instead of one global model. Client i keeps a personalised model θ_i and is associated with one
generalized model ω_{k(i)}:

    inner:  θ_i ≈ argmin_θ  L_i(θ; D_b) + (μ/2) · ‖θ − ω_i‖²             (a few SGD steps on one batch D_b)
    outer:  ω_i ← ω_i − η · μ · (ω_i − θ_i)                                (pFedMe's local update)

In round t a sampled client sets its local copy ω_i ← ω_{k(i)}, runs R local rounds (each: a fresh
mini-batch, ``inner_steps`` SGD steps on θ_i with the proximal term towards the current ω_i, then
the outer step on ω_i), keeps θ_i and uploads only ω_i. The server clusters the uploaded local
generalized models with k-means into K groups and moves each generalized model towards the mean of
its group, with pFedMe's server step β:

    ω_k ← (1 − β) · ω_k + β · mean_{i ∈ S_k} ω_i                           (β = 1: the plain mean)

Clients are evaluated with their personalised θ_i. There is no single global model.

Only the abstract of the paper and FedAC's summary of it could be read here (the full text was not
reachable), so beyond the structure above everything is *interpretation*, each a named option:

- ``num_clusters`` K = 3: the value the paper found best could not be checked.
- ``mu`` μ = 15, ``inner_steps`` = 5, β = 1: pFedMe's defaults (Dinh et al., NeurIPS 2020), whose
  scheme CGPFL extends. ``eta`` η and ``personal_lr`` default to the run's --lr. Keep η·μ ≤ 1 (the
  outer step moves ω_i at most all the way to θ_i) and personal_lr·μ < 2 (a stable proximal step).
- R, the local rounds: one per mini-batch of the run's schedule (--local-steps batches if set,
  else --local-epochs × ⌈n_i / B⌉); each draws a fresh batch of B samples without replacement.
- θ_i persists across rounds and the inner solve starts from it (``warm_start``, the option's
  default); pFedMe's code restarts θ from the received model every round (``warm_start=false``),
  which is the reference a new run gets (``fedtail list``): CGPFL's own code could not be found,
  and CGPFL is pFedMe's scheme with K generalized models. ``first_start``: a
  client's θ_i starts as the first generalized model it receives (``received``, the default, as
  pFedMe's θ starts from the model it is sent) or as the run's initial model (``init``, where
  local training and FedAC's default start every client); the local copy ω_i is the received
  generalized model either way. A client never sampled is evaluated with its would-be start.
- Only parameters follow the outer step; buffers (BatchNorm statistics) of the upload are θ_i's,
  the only estimate of the client's data, so the generalized models' statistics stay current.
- Clustering: scikit-learn k-means (k-means++, 10 restarts, seeded from the run seed and the
  round) on the flattened floating-point tensors of this round's uploads (on their Gram
  coordinates, the same problem in n numbers per upload: :mod:`fedtail.algorithms.clustering`),
  with k = min(K, uploads), every ``recluster_every`` rounds. If the paper's clustering carries size constraints, they are
  not implemented. k-means labels are arbitrary, so its clusters are matched one-to-one to the
  nearest current generalized models (Hungarian matching, squared distance): a cluster continues
  the model it is closest to. Generalized models whose cluster is empty this round are unchanged.
  In rounds without re-clustering a client keeps its association; a client without one joins the
  generalized model nearest to its upload.
- The group mean is uniform over members, as pFedMe's (``weighting="samples"``: by n_i).
- All K generalized models start as the run's initial model. A client never sampled is sent (for
  training and evaluation) the mean of the generalized models weighted by how many clients each
  currently holds (uniform before any assignment): the nearest thing to a global model.

Missing replies (``--dropout``, rejected replies): k-means runs on the uploads that arrived
(k = min(K, uploads)), and generalized models that no cluster of them continues are unchanged. A
client that did not reply keeps its θ_i and its association; the fallback model counts the
associations of every client that ever uploaded.

Devices: the server's k-means and matching (Gram matrices, SciPy's assignment) run on the CPU,
where the uploads arrive; the clients' inner steps on ``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtail.algorithms.aggregate import PER_CLUSTER, WeightedMean, weighted_mean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    Comm,
    Message,
    PersonalClient,
    Reference,
    ServerHalf,
    Tensors,
    shuffled,
    Term,
)
from fedtail.algorithms.clustering import (
    centred_gram,
    cluster_means,
    cluster_record,
    flatten,
    float_keys,
    full_record,
    gram_coordinates,
    kmeans,
    project_2d,
    squared_distances,
)
from fedtail.algorithms.fedprox import proximal_term

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext

KMEANS_RESTARTS = 10


class CGPFLConfig(AlgorithmConfig):
    num_clusters: int = Field(3, ge=1, le=1000, description="K, the number of contextualized generalized models")
    mu: float = Field(15.0, gt=0, description="μ in (μ/2)·‖θ_i − ω_i‖²: pull of the personal model to the generalized")
    inner_steps: int = Field(5, ge=1, description="SGD steps on θ_i per local round, all on the round's one batch")
    personal_lr: float | None = Field(None, gt=0, description="learning rate of the inner steps (null: the run's --lr)")
    eta: float | None = Field(
        None, gt=0, description="η of the local update ω_i ← ω_i − η·μ·(ω_i − θ_i) (null: the run's --lr)"
    )
    beta: float = Field(1.0, gt=0, le=2, description="server step β: ω_k ← (1−β)·ω_k + β·mean (1: plain mean)")
    recluster_every: int = Field(1, ge=1, description="run k-means every this many rounds (else keep associations)")
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="cluster mean over members: uniform (pFedMe) or by training-sample count"
    )
    warm_start: bool = Field(
        True, description="inner solve starts from the stored θ_i (false: from the received model, as pFedMe's code)"
    )
    first_start: Literal["received", "init"] = Field(
        "received",
        description="θ_i before a client's first training: the generalized model it is sent, or the run's initial "
        "model (with warm_start; the local copy ω_i is the received model either way)",
    )

    @model_validator(mode="after")
    def _first_start_needs_warm_start(self) -> "CGPFLConfig":
        if self.first_start == "init" and not self.warm_start:
            raise ValueError(
                "first_start='init' needs warm_start=true (without it θ_i restarts from the received model; "
                "CGPFL's reference runs warm_start=false, so set cgpfl.warm_start=true with it)"
            )
        return self


# --- server -------------------------------------------------------------------------------------


def kmeans_labels(points: torch.Tensor, k: int, seed: int) -> np.ndarray:
    """k-means labels (0..k−1) of the rows of ``points``, reproducible from ``seed``.

    Run on the rows' Gram coordinates (float64, n numbers per row; ``clustering.kmeans``): the
    same problem as on the d-dimensional rows. Earlier versions ran scikit-learn's k-means on the
    float32 rows, in float32: the partitions agree on separated clusters (tests).
    """
    if len(points) < 2 or points.shape[1] <= len(points):
        coords = points.to(torch.float64).numpy()
    else:
        coords = gram_coordinates(centred_gram(points))
    return kmeans(coords, k, seed % 2**32, n_init=KMEANS_RESTARTS, dim=points.shape[1]).labels_


def match_to_centers(means: torch.Tensor, centers: torch.Tensor) -> np.ndarray:
    """For each row of ``means``, the distinct row of ``centers`` it continues (min total ‖·‖²)."""
    from scipy.optimize import linear_sum_assignment  # here, not at the top: seconds off every process start

    rows, cols = linear_sum_assignment(squared_distances(means, centers).numpy())
    out = np.empty(len(means), dtype=int)
    out[rows] = cols
    return out


def server_step(old: Tensors, mean: Tensors, beta: float) -> Tensors:
    """pFedMe's ``(1 − β)·old + β·mean`` on floating-point tensors; integer buffers take the mean."""
    if beta == 1.0:
        return mean
    return {k: (1 - beta) * old[k] + beta * v if v.is_floating_point() else v for k, v in mean.items()}


class CGPFLServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: CGPFLConfig = ctx.options
        self.centers: list[Tensors] = [dict(ctx.init_weights) for _ in range(opts.num_clusters)]
        self.assignment: dict[int, int] = {}  # client -> generalized model, once sampled
        self.fallback: Tensors = dict(ctx.init_weights)  # for clients never sampled

    def model_for(self, cid: int) -> Tensors:
        label = self.assignment.get(cid)
        return self.fallback if label is None else self.centers[label]

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: CGPFLConfig = self.ctx.options
        replies = comm.exchange({cid: Message("fit", self.model_for(cid)) for cid in clients})
        order = sorted(replies)
        keys = float_keys(replies[order[0]].tensors)
        points = torch.stack([flatten(replies[cid].tensors, keys) for cid in order])
        reclustered = (rnd - 1) % opts.recluster_every == 0
        labels = self._labels(rnd, order, points, keys, reclustered)
        for label in np.unique(labels):
            mean = WeightedMean()
            for cid, lab in zip(order, labels):
                if lab == label:
                    weight = replies[cid].num_examples if opts.weighting == "samples" else 1.0
                    mean.add(replies[cid].tensors, weight)
            self.centers[label] = server_step(self.centers[label], mean.result(), opts.beta)
        self.assignment.update({cid: int(lab) for cid, lab in zip(order, labels)})
        self.fallback = self._membership_mean()
        everyone = sorted(self.assignment)
        full = full_record(self.ctx.config, rnd)
        # The 2-D view covers this round's uploads only (the server keeps no one else's).
        view = {"round_clients": order, "round_pca": project_2d(points)} if full else {}
        comm.log(
            clustering=cluster_record(
                everyone, [self.assignment[c] for c in everyone], full=full, reclustered=reclustered, **view
            )
        )

    def _labels(self, rnd: int, order: list[int], points: torch.Tensor, keys: list[str], recluster: bool) -> np.ndarray:
        """The generalized model each uploading client is associated with from now on."""
        centers = torch.stack([flatten(c, keys) for c in self.centers])
        if recluster:
            groups = kmeans_labels(points, min(len(self.centers), len(order)), self.ctx.seed(rnd))
            means = cluster_means(points, groups)
            continued = match_to_centers(torch.stack([means[g] for g in sorted(means)]), centers)
            return continued[np.searchsorted(sorted(means), groups)]
        nearest = squared_distances(points, centers).argmin(dim=1).tolist()
        return np.array([self.assignment.get(cid, near) for cid, near in zip(order, nearest)], dtype=int)

    def _membership_mean(self) -> Tensors:
        """The generalized models averaged by how many clients each holds (uniform if none)."""
        counts = np.bincount(list(self.assignment.values()), minlength=len(self.centers))
        if counts.sum() == 0:
            counts = np.ones(len(self.centers), dtype=int)
        return weighted_mean((c, float(n)) for c, n in zip(self.centers, counts) if n > 0)

    def evaluation_message(self, cid: int) -> Message:
        # A sampled client evaluates its own θ_i; this model serves clients never sampled.
        if cid not in self.assignment and self.ctx.options.first_start == "init":
            return Message("evaluate", dict(self.ctx.init_weights))
        return Message("evaluate", self.model_for(cid))


# --- client -------------------------------------------------------------------------------------


def local_batches(ctx: ClientContext) -> Iterator[torch.Tensor]:
    """One fresh mini-batch per local round: --local-steps of them, else as many as the run's epochs hold."""
    cfg = ctx.train_config
    n = len(ctx.data.train)
    rounds = cfg.local_steps or cfg.local_epochs * -(-n // cfg.batch_size)
    for _ in range(rounds if n else 0):
        yield shuffled(ctx.data.train, ctx.generator)[: cfg.batch_size]


def pull_towards(local: Tensors, model: nn.Module, step: float) -> None:
    """In place, for every parameter: ω ← ω − step·(ω − θ)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local[name].sub_(step * (local[name] - p))


class CGPFLClient(PersonalClient):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: CGPFLConfig = ctx.options
        first = ctx.init_weights if opts.first_start == "init" else msg.tensors
        start = ctx.state.get("personal", first) if opts.warm_start else msg.tensors
        personal = ctx.load(start, role="personal")
        # ω_i, the local copy of the generalized model: its parameters only (buffers come from θ_i).
        local = {name: msg.tensors[name].detach().clone() for name, _ in personal.named_parameters()}
        # The proximal term holds ``local``'s tensors, so the in-place outer steps move its anchor.
        prox = Term(proximal_term(personal, local, opts.mu))
        eta = ctx.lr if opts.eta is None else opts.eta
        for batch in local_batches(ctx):
            ctx.train("personal", index=batch, epochs=opts.inner_steps, lr=opts.personal_lr, hook=prox)
            pull_towards(local, personal, eta * opts.mu)
        ctx.state["personal"] = ctx.weights("personal")
        return ctx.reply(ctx.weights("personal") | local)  # never θ_i's parameters


CGPFL = Algorithm(
    name="cgpfl",
    summary="CGPFL (Tang et al. 2022): pFedMe-style personal models pulled to K k-means-clustered generalized models",
    server=CGPFLServer,
    client=CGPFLClient,
    config=CGPFLConfig,
    # CGPFL's code could not be found; pFedMe's, which it extends, restarts θ_i every round
    reference=Reference("pFedMe's code (CharlieDinh/pFedMe), CGPFL's base", options={"warm_start": False}),
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
