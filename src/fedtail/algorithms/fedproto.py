"""FedProto: Federated Prototype Learning across Heterogeneous Clients.

Tan, Long, Liu, Zhou, Lu, Jiang and Zhang, AAAI 2022 (Algorithm 1). No model weights are
shared: every client keeps its whole model F_k = (body f_k, head g_k) in its own state and the
clients exchange only class *prototypes*, mean body features per class. With D_k^j the samples
of class j on client k:

    local prototype       c_k^j = (1 / |D_k^j|) · Σ_{(x, y) ∈ D_k^j} f_k(x)                  (Eq. 4)
    global prototype      C^j   = Σ_{k ∈ N_j} |D_k^j| · c_k^j / Σ_{k ∈ N_j} |D_k^j|          (Eq. 5)
    local objective       L_k   = CE(F_k(x), y) + λ · R(f_k(x), C^y)                        (Eq. 6)
    inference             ŷ     = argmin_j ‖f_k(x) − C^j‖₂

N_j is the set of participating clients holding class j. The regulariser only covers labels
that have a global prototype; in round 1 there is none, so clients train with CE alone.
The server's global prototypes come from the round's participants; a class that none of them
holds keeps its previous global prototype (``keep_absent``, *interpretation*: the paper's
experiments sample every client, and without it a tail class held by unsampled clients could
not be predicted by anyone until one of its holders is sampled again).

Options and *interpretations*:

- ``aggregation`` (default ``weighted``): Eq. 5 weights client k's prototype by |D_k^j| / N_j
  (N_j the class's total count) and also writes a leading 1/|N_j|, which would shrink every
  prototype by the number of holders; we read it as the sample-weighted mean above.
  ``uniform`` is the plain mean over the holders, as in the authors' code.
- ``alignment`` (default ``mse``): R is "a distance" (L2); the authors' code uses PyTorch's
  MSELoss over the batch, Σ_i Σ_d (f_id − C^{y_i}_d)² / (B·d), with a sample's own feature as the
  target where its label has no prototype (so it adds 0 but still counts in B). ``l2sq`` is
  Σ_i ‖f_i − C^{y_i}‖² / B. λ = 1 (FedReMa's setting, and the authors' default).
- ``prototypes`` (default ``trained``): computed *after* local training, with the trained body in
  inference mode over the client's whole training data (Eq. 4 read literally); ``training``:
  the mean of the features of the training batches as the model changes (all E epochs, train
  mode), as the authors' code and PFLlib's ``clientproto.py`` do.
- ``predict`` (default ``prototype``, FedProto's inference): the class of the nearest global
  prototype in L2 among the classes that have one (scores −‖f − C^j‖²/d, so the evaluation
  loss is a cross-entropy of those scores); ``head`` evaluates the client's own classifier.
  Before any global prototype exists a client is evaluated with its head.
- A client starts from the run's common initial model (FedProto allows heterogeneous models;
  here all clients share the run's architecture) and, when not sampled, keeps its model.

With λ = 0 and ``predict = head`` every client trains and is evaluated exactly as in ``local``.

Missing replies (``--dropout``, rejected replies): N_j is the replying clients holding class j; a
class none of them holds keeps its previous global prototype (``keep_absent``; dropped
otherwise), as a class no sampled client holds. A client that did not reply keeps its model.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them):
the head is the last linear layer as in PFLlib (``model.fc``), whose implementation stands for
FedReMa's baseline, so prototypes live in that layer's input space (on ``cnn2fc`` the 512
outputs of FC 512, not the 1024-d convolution output); plain SGD (momentum 0), no clipping;
global prototypes as the plain mean over their holders (``aggregation="uniform"``, PFLlib's
``proto_aggregation``, as the authors' code) of prototypes averaged over the training batches
(``prototypes="training"``).

Devices: the server's prototype means run on the CPU, where the uploads arrive; the clients'
prototypes and prediction on ``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, Comm, Message, Reference, ServerHalf, Tensors
from fedtail.algorithms.base import FeatureTerm
from fedtail.algorithms.local import LocalClient
from fedtail.algorithms.prototypes import (
    Alignment,
    ClassMean,
    ClassStats,
    Weighting,
    alignment_loss,
    class_statistics,
    nearest_prototype_scores,
)

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import FeatureLoss

# Names on the wire.
MEANS = "proto.means"  # (C, d) prototypes, both directions
COUNTS = "proto.counts"  # (C,) client -> server: samples per class
PRESENT = "proto.present"  # (C,) server -> client: classes that have a global prototype


class FedProtoConfig(AlgorithmConfig):
    lam: float = Field(1.0, ge=0, description="λ: weight of the features' distance to their class's global prototype")
    predict: Literal["prototype", "head"] = Field(
        "prototype", description="inference: nearest global prototype (FedProto) or the client's own head"
    )
    keep_absent: bool = Field(
        True, description="a class no participant holds keeps its previous global prototype (false: dropped)"
    )
    aggregation: Weighting = Field(
        "weighted", description="global prototype: mean weighted by class counts (Eq. 5) or uniform over holders (code)"
    )
    alignment: Alignment = Field(
        "mse", description="R: mse = mean over samples and feature dims (code); l2sq = mean squared L2 distance"
    )
    prototypes: Literal["trained", "training"] = Field(
        "trained",
        description="local prototypes: of the trained model in inference mode (Eq. 4), or the mean of the "
        "training batches' features (the authors' code, PFLlib)",
    )


def global_prototypes(protos: torch.Tensor | None, present: torch.Tensor | None) -> Tensors:
    """The server → client payload (empty before the first aggregation)."""
    return {} if protos is None else {MEANS: protos, PRESENT: present}


def prototype_payload(msg: Message) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The global prototypes in a message, or None if there are none yet."""
    if MEANS not in msg.tensors or not bool(msg.tensors[PRESENT].any()):
        return None
    return msg.tensors[MEANS], msg.tensors[PRESENT]


def recording(loss: FeatureLoss | None, record: ClassStats | None) -> FeatureLoss | None:
    """``loss`` for ``ctx.train``, also adding every batch's features to ``record`` (if given)."""
    if record is None:
        return loss

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, features: torch.Tensor):
        record.add(features.detach(), y)
        return features.new_zeros(()) if loss is None else loss(model, x, y, logits, features)

    return term


class FedProtoServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.protos: torch.Tensor | None = None
        self.present: torch.Tensor | None = None

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FedProtoConfig = self.ctx.options
        out = global_prototypes(self.protos, self.present)
        mean = ClassMean(opts.aggregation)
        for _, reply in comm.stream({cid: Message("fit", out) for cid in clients}):
            mean.add(reply.tensors[MEANS], reply.tensors[COUNTS])
        protos, present = mean.result()
        if opts.keep_absent and self.protos is not None:
            protos = torch.where(present[:, None], protos, self.protos)
            present = present | self.present
        self.protos, self.present = protos, present
        comm.log(fedproto_classes=int(self.present.sum()))

    def evaluation_message(self, cid: int) -> Message:
        opts: FedProtoConfig = self.ctx.options
        if opts.predict == "head":
            return Message("evaluate")
        return Message("evaluate", global_prototypes(self.protos, self.present))


class FedProtoClient(LocalClient):
    """Keeps its whole model in ``ctx.state["weights"]`` (as ``local``); uploads prototypes only."""

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedProtoConfig = ctx.options
        model = self._personal(ctx)
        target = prototype_payload(msg)
        # λ = 0 or no prototypes yet: plain CE, the very same pass as local training.
        align = None if target is None or opts.lam == 0 else alignment_loss(*target, opts.lam, opts.alignment)
        record = ClassStats.zeros(ctx.num_classes, model.feature_dim, ctx.device) if opts.prototypes == "training" else None
        ctx.train(hook=FeatureTerm(recording(align, record)))
        ctx.state["weights"] = ctx.weights()
        if record is None:
            record = class_statistics(model, ctx.dataset, ctx.data.train, ctx.num_classes)
        return ctx.reply({MEANS: record.means, COUNTS: record.counts})

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        model = self._personal(ctx)
        target = prototype_payload(msg)
        if target is None:  # predict = head, or no global prototype yet
            return ctx.evaluate()
        protos, present = target
        return ctx.evaluate(predict=lambda x: nearest_prototype_scores(model.features(x), protos, present))


FEDPROTO = Algorithm(
    name="fedproto",
    summary="FedProto (Tan et al. 2022): local models exchange class prototypes; nearest-prototype inference",
    server=FedProtoServer,
    client=FedProtoClient,
    config=FedProtoConfig,
    reference=Reference(PFLLIB, head="last", options={"aggregation": "uniform", "prototypes": "training"}),
    why_not={"segmentation": "its prototypes and nearest-prototype prediction are of flat per-sample features"},
    robust="averages per-class prototypes, not models",
    dp="uploads class prototypes, not updates of a model sent",
)
