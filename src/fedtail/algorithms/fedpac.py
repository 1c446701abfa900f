"""FedPAC: Personalized Federated Learning with Feature Alignment and Classifier Collaboration.

Xu, Tong and Huang, ICLR 2023 (Algorithm 1). The model is a shared feature extractor (body) φ
and a personalised classifier (head) w_k per client. Round t, for each sampled client k given
the global body φ^t and the global prototypes c^t:

1. statistics for the classifier collaboration, with the received body:
   n_k^j samples of class j, p_k(j) = n_k^j / n_k, μ_k^j = mean feature of class j,

       h_k^j = p_k(j) · μ_k^j                                       (prior-weighted prototypes)
       V_k   = (1/n_k) · Σ_j [ p_k(j) · E_{x|j} ‖φ(x)‖² − p_k(j)² · ‖μ_k^j‖² ]  (variance term)

2. the head for ``head_epochs`` (1) epoch with the body frozen, loss CE;
3. the body for the run's E epochs with the head frozen, loss (feature alignment)

       CE(w_k; φ(x), y) + λ · R(φ(x), c^y),   R = a squared distance to the class's global prototype;

4. local prototypes ĉ_k^j = mean of φ_k(x) over the client's samples of class j (trained body);
5. upload φ_k, w_k, ĉ_k, n_k^j, V_k and h_k.

Server: φ^{t+1} = Σ_k (n_k / n) φ_k (sample-weighted, as FedAvg); c^{t+1,j} = Σ_k n_k^j ĉ_k^j / Σ_k n_k^j
over the participants holding j (``aggregation="weighted"``, the paper; ``uniform``: the plain mean
over the holders, PFLlib's ``proto_aggregation``); and for every participant k the combination weights

    α_k = argmin_{α ∈ Δ} α^T (diag(V) + D^{(k)}) α,   D^{(k)}_{ij} = Σ_c ⟨h_k^c − h_i^c, h_k^c − h_j^c⟩,

i.e. the estimated test loss Σ_i α_i² V_i + Σ_c ‖Σ_i α_i h_i^c − h_k^c‖² of the paper's
classifier-collaboration objective (i, j over the round's participants, Δ the simplex), solved
with SciPy's SLSQP. Client k's next head is w_k ← Σ_j α_kj · w_j, sent back in a second exchange;
clients not sampled keep their heads. Clients are evaluated with the current global body and
their own head (first time: the run's initial head). There is no global model.

*Interpretations* (the authors' code settles most of them; the paper text leaves them open):

- ``statistics`` (default ``received``): V_k and h_k are computed before local training with the
  received global body, so all participants' h live in one feature space (the authors' loop
  extracts them before training); ``trained``: with the client's trained body.
- ``alignment`` (default ``mse``): R as PyTorch's MSELoss over batch × feature dims (the authors'
  code, with λ = 1 as FedReMa sets it); ``l2sq``: Σ_i ‖φ(x_i) − c^{y_i}‖² / B, the squared
  distance summed over feature dims (λ then weighs d times more).
  Labels without a global prototype add nothing (``missing_prototype = skip``); the authors' code
  pulls them to the client's own prototype computed before training (``local``). Either way
  round 1, which has no global prototypes at all, trains with CE alone.
- ``min_weight`` (default 1e-3): weights below it are solver noise and set to 0, as in the
  authors' code, which does not renormalise; here the rest is renormalised to sum 1. If the
  solver fails, α_k = e_k (the client keeps its own trained head, the authors' fallback).
- The "classifier" combined is the model's head, by the reference split the last linear layer
  (the paper's linear classifier; PFLlib's ``model.fc``), so on cnn2fc the quadratic program
  mixes 5,130-parameter heads and the statistics, prototypes and alignment live in FC 512's
  512-d output (the head's input); ``--head all-fc`` mixes both FC layers on the 1024-d
  convolution output, as runs made before the reference split did.
- The head epoch uses the run's optimizer settings and learning rate (the authors' code uses lr
  0.1 for it, FedReMa a single lr 0.01 for all methods).
- Global prototypes are rebuilt from each round's participants only.

Missing replies (``--dropout``, rejected replies): φ and the global prototypes average the
replies that arrived (a class none of them holds has no global prototype next round); the QP and
the head combinations run over the replying clients only, and only they are sent a combined head.
A client that did not reply keeps its head; one whose ``set_head`` reply is rejected keeps the
head it trained.

Reference settings (``fedtail list``; a run gets them unless it sets them): PFLlib's, whose
implementation stands for FedReMa's baseline: the last linear layer as the head, plain SGD
(momentum 0), no clipping, global prototypes as the uniform mean over their holders
(``aggregation="uniform"``); PFLlib trains the head for one epoch before the body's E, as
``head_epochs = 1`` does.

Devices: each client's quadratic program (SciPy) runs on the server's CPU, where the statistics
arrive; the clients' prototypes and training on ``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field

from fedtail.algorithms.aggregate import WeightedMean, weighted_mean
from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, Comm, Message, Reference
from fedtail.algorithms.base import FeatureTerm
from fedtail.algorithms.fedproto import COUNTS, MEANS, global_prototypes, prototype_payload
from fedtail.algorithms.fedrep import FedRepClient, BodyServer, train_only
from fedtail.algorithms.prototypes import Alignment, ClassMean, ClassStats, Weighting, alignment_loss, class_statistics

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import FeatureLoss, TrainStats
    from fedtail.models import SplitModel

# Names on the wire beside the model's own keys and the prototypes.
VARIANCE = "pac.v"  # () V_k
PRIOR_PROTOS = "pac.h"  # (C, d) h_k


class FedPACConfig(AlgorithmConfig):
    lam: float = Field(1.0, ge=0, description="λ: weight of the feature alignment to the global prototypes")
    alignment: Alignment = Field(
        "mse", description="R: mse = mean over samples and feature dims (code); l2sq = mean squared L2 distance"
    )
    head_epochs: int = Field(1, ge=1, description="epochs on the head (body frozen) before the body's epochs")
    statistics: Literal["received", "trained"] = Field(
        "received", description="body used for V_k and h_k: the received global body, or the trained local one"
    )
    missing_prototype: Literal["skip", "local"] = Field(
        "skip",
        description="labels without a global prototype: no alignment, or to the client's own pre-training prototype",
    )
    min_weight: float = Field(
        1e-3, ge=0, lt=1, description="combination weights below this are set to 0 (the rest renormalised)"
    )
    aggregation: Weighting = Field(
        "weighted", description="global prototypes: weighted by class counts (the paper) or uniform over holders (PFLlib)"
    )


# --- the classifier-collaboration statistics and quadratic program --------------------------------


def collaboration_statistics(stats: ClassStats) -> tuple[torch.Tensor, torch.Tensor]:
    """V_k (a float64 scalar) and h_k (float64, (C, d)) from a client's class statistics."""
    n = stats.counts.sum().clamp(min=1).to(torch.float64)
    prior = stats.counts.to(torch.float64) / n
    counts = stats.counts.clamp(min=1).to(torch.float64)
    mu = stats.sums / counts.unsqueeze(1)
    second_moment = stats.sq_norms / counts  # E_{x|j} ‖φ(x)‖²
    v = (prior * second_moment - prior.pow(2) * mu.pow(2).sum(1)).sum() / n
    return v, prior.unsqueeze(1) * mu


def collaboration_matrix(v: torch.Tensor, h: torch.Tensor, k: int) -> np.ndarray:
    """diag(V) + D^{(k)}: the quadratic form of client k's estimated test loss over α.

    ``v``: (m,) variance terms, ``h``: (m, C, d) prior-weighted prototypes of the m participants.
    """
    delta = (h[k].unsqueeze(0) - h).reshape(len(h), -1).to(torch.float64)
    return (torch.diag(v.to(torch.float64)) + delta @ delta.T).numpy()


def simplex_qp(matrix: np.ndarray) -> tuple[np.ndarray, bool]:
    """argmin_{α ≥ 0, Σα = 1} α^T Q α by SLSQP from the uniform point; also whether it converged.

    Q is scaled to a unit largest entry first (the minimiser does not change, the tolerances
    become meaningful whatever the feature scale).
    """
    m = len(matrix)
    if m == 1:
        return np.ones(1), True
    q = matrix / max(float(np.abs(matrix).max()), 1e-300)
    q = 0.5 * (q + q.T)
    from scipy.optimize import minimize  # here, not at the top: seconds off every process start

    result = minimize(
        lambda a: float(a @ q @ a),
        np.full(m, 1.0 / m),
        jac=lambda a: 2.0 * (q @ a),
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones_like(a)}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    alpha = np.clip(result.x, 0.0, None)
    total = alpha.sum()
    if not result.success or not np.isfinite(total) or total <= 0:
        return np.full(m, 1.0 / m), False
    return alpha / total, True


def combination_weights(v: torch.Tensor, h: torch.Tensor, min_weight: float) -> np.ndarray:
    """Row k: client k's weights α_k over the m participants (each row on the simplex)."""
    m = len(v)
    weights = np.zeros((m, m))
    for k in range(m):
        alpha, ok = simplex_qp(collaboration_matrix(v, h, k))
        if not ok:  # no usable solution: keep the own head
            alpha = np.eye(m)[k]
        floored = np.where(alpha < min_weight, 0.0, alpha)
        if floored.sum() > 0:  # (all under the floor only with more than 1/min_weight peers)
            alpha = floored
        weights[k] = alpha / alpha.sum()
    return weights


# --- server and client ------------------------------------------------------------------------------


class FedPACServer(BodyServer):
    """FedRep's global body, plus global prototypes and a combined head per participant."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.protos: torch.Tensor | None = None
        self.present: torch.Tensor | None = None

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FedPACConfig = self.ctx.options
        out = self.body | global_prototypes(self.protos, self.present)
        bodies, protos = WeightedMean(), ClassMean(opts.aggregation)
        heads, v, h = {}, {}, {}
        for cid, reply in comm.stream({cid: Message("fit", out) for cid in clients}):
            t = reply.tensors
            bodies.add({k: t[k] for k in self.body}, reply.num_examples)
            protos.add(t[MEANS], t[COUNTS])
            heads[cid] = {k: value for k, value in t.items() if k.startswith("head.")}
            v[cid], h[cid] = t[VARIANCE], t[PRIOR_PROTOS]
        self.body = bodies.result()
        self.protos, self.present = protos.result()

        order = sorted(heads)
        v_all, h_all = torch.stack([v[c] for c in order]), torch.stack([h[c] for c in order])
        alpha = combination_weights(v_all, h_all, opts.min_weight)
        new_heads = {
            cid: weighted_mean((heads[j], float(a)) for j, a in zip(order, alpha[row]) if a > 0)
            for row, cid in enumerate(order)
        }
        comm.exchange({cid: Message("set_head", head) for cid, head in new_heads.items()})
        comm.log(fedpac_alpha={"clients": order, "weights": np.round(alpha, 4).tolist()})


def train_body(ctx: ClientContext, model: SplitModel, feature_loss: FeatureLoss | None) -> TrainStats:
    """The run's local epochs on the body with the head frozen, with the alignment loss."""
    return train_only(ctx, model.body, model.head, None, hook=FeatureTerm(feature_loss))


class FedPACClient(FedRepClient):
    """FedRep's evaluation: the global body with the client's own head from ``ctx.state``."""

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedPACConfig = ctx.options
        body = {k: v for k, v in msg.tensors.items() if k.startswith("body.")}
        model = self._load(body, ctx)
        target = prototype_payload(msg)
        before = None  # the received body's class statistics
        if opts.statistics == "received" or (opts.missing_prototype == "local" and target is not None):
            before = class_statistics(model, ctx.dataset, ctx.data.train, ctx.num_classes)
        if target is not None and opts.missing_prototype == "local":
            protos, present = target
            # Global prototype where there is one, else the client's own (before training).
            target = (torch.where(present.unsqueeze(1), protos, before.means), present | before.present)
        train_only(ctx, model.head, model.body, opts.head_epochs)
        feature_loss = None if target is None or opts.lam == 0 else alignment_loss(*target, opts.lam, opts.alignment)
        train_body(ctx, model, feature_loss)
        local = class_statistics(model, ctx.dataset, ctx.data.train, ctx.num_classes)
        v, h = collaboration_statistics(before if opts.statistics == "received" else local)
        # The trained head stays until the server sends the combined one.
        ctx.state["head"] = ctx.weights(keys=model.head_keys())
        extra = {MEANS: local.means, COUNTS: local.counts, VARIANCE: v, PRIOR_PROTOS: h.to(torch.float32)}
        return ctx.reply(ctx.weights() | extra)

    def set_head(self, msg: Message, ctx: ClientContext) -> Message:
        """The server's combination Σ_j α_kj w_j becomes this client's head."""
        ctx.state["head"] = dict(msg.tensors)
        return ctx.reply()


FEDPAC = Algorithm(
    name="fedpac",
    summary="FedPAC (Xu et al. 2023): shared body aligned to global prototypes; heads mixed by a per-client QP",
    server=FedPACServer,
    client=FedPACClient,
    config=FedPACConfig,
    reference=Reference(PFLLIB, head="last", options={"aggregation": "uniform"}),
    why_not={"segmentation": "its per-class feature centroids and classifier combination are of flat per-sample features"},
    robust="combines the heads per client with weights it optimises from the uploads",
)
