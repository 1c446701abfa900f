"""FedDistill: federated distillation with per-label global average logits.

Jeong, Oh, Kim, Park, Bennis and Kim, "Communication-Efficient On-Device Machine Learning:
Federated Distillation and Augmentation under Non-IID Private Data", NeurIPS workshop 2018
(arXiv:1811.11479, Algorithm 1: FD); the FedDistill baseline of FedReMa. No model weights are
shared: every client keeps its whole model F_k and the clients exchange, per label ℓ, the mean
logit vector of their training samples:

    client k uploads      F_k^ℓ = mean of F_k(x) over its samples with y = ℓ, and n_k^ℓ
    server                F̂^ℓ   = Σ_{j ∈ S^ℓ} n_j^ℓ F_j^ℓ / Σ_{j ∈ S^ℓ} n_j^ℓ
    teacher of client k   F̂_k^ℓ = the same mean over S^ℓ \\ {k}            (exclude_self)
    local loss            CE(F_k(x), y) + λ · φ(F_k(x), F̂_k^y)

S^ℓ is the set of the previous round's participants that uploaded label ℓ. Labels without a
teacher (round 1, or no other holder) add no distillation term.

Options and *interpretations*:

- ``exclude_self`` (default true): FD's Algorithm 1 gives device k the global average minus its
  own contribution, so a client is not distilled towards itself. With partial participation
  only the previous round's participants contribute; a client that was not among them gets the
  plain average. ``false``: every client gets the same global average (the usual re-implementations).
- ``aggregation`` (default ``weighted``): average weighted by the logit counts n_j^ℓ (the mean
  over the pooled samples); ``uniform``: every holder counts once (FD divides by M − 1).
- ``regularizer`` (default ``kl``): φ in FD is the training loss itself, a cross-entropy, here
  against the teacher's distribution: KL(softmax(F̂_k^y) ‖ softmax(F_k(x))), summed over classes,
  averaged over the batch (same gradient as the soft-label cross-entropy). ``mse``: PyTorch's
  MSELoss between the logits and the teacher logits over batch × classes, samples without a
  teacher adding 0 (as a sample's own logits would).
- ``logits`` (default ``training``): as in FD, the uploaded means are running means of the logits
  produced during local training (train mode, all E epochs, so n_k^ℓ = E·|D_k^ℓ| and the logits
  come from a changing model); ``inference``: the trained model's logits on the client's training
  data in inference mode afterwards (n_k^ℓ = |D_k^ℓ|).
- Logits are raw (pre-softmax) scores; the teacher's distribution is the softmax of their mean.
- The server keeps only the previous round's uploads (the teacher is rebuilt every round);
  FD's federated augmentation (the GAN) is not part of the baseline. λ = 1 (FedReMa).

With λ = 0 every client trains and is evaluated exactly as in ``local``.

Missing replies (``--dropout``, rejected replies): S^ℓ is made of the previous round's clients
that replied. A client whose reply did not arrive adds nothing to the teachers (with
``exclude_self`` it is then given the plain average) and keeps its model.

Reference settings (what a run gets unless it sets them; ``fedtail list``): PFLlib's, the
library FedReMa's code is built on and whose implementations stand for FedReMa's baselines:
plain SGD (momentum 0), no gradient clipping, the model's own body/head split
(unused: the logits are the whole model's), and PFLlib's FedDistill: ``regularizer="mse"``
(``clientdistill.py``: λ·MSELoss between the batch logits and the global logits of their
labels, a sample's own logits where its label has none), ``exclude_self=false`` and
``aggregation="uniform"`` (``serverdistill.py``: one plain mean over the uploading clients, sent
to everybody). The option defaults are FD's reading above.

Devices: the server's per-label logit means run on the CPU, where the uploads arrive; clients on
``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, Comm, Message, Reference, Tensors
from fedtail.algorithms.base import Term
from fedtail.algorithms.local import LocalClient, LocalServer
from fedtail.algorithms.prototypes import ClassMean, ClassStats, Weighting, class_statistics, class_target_loss

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import ExtraLoss

# Names on the wire.
MEANS = "distill.means"  # (C, C) client -> server: mean logits per label
COUNTS = "distill.counts"  # (C,) client -> server: logits averaged per label
TEACHER = "distill.teacher"  # (C, C) server -> client: teacher logits per label
PRESENT = "distill.present"  # (C,) server -> client: labels that have a teacher

Regularizer = Literal["kl", "mse"]


class FedDistillConfig(AlgorithmConfig):
    lam: float = Field(1.0, ge=0, description="λ: weight of the distillation term towards the global logits")
    regularizer: Regularizer = Field(
        "kl", description="φ: kl = KL(softmax(teacher) ‖ softmax(logits)); mse = MSE between logits"
    )
    exclude_self: bool = Field(True, description="teacher = global average without the client's own upload (FD)")
    aggregation: Weighting = Field(
        "weighted", description="global logits: mean weighted by logit counts, or uniform over holders"
    )
    logits: Literal["training", "inference"] = Field(
        "training", description="uploaded means: of the logits seen in local training (FD), or of the trained model"
    )


def distill_divergence(
    logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor, present: torch.Tensor, regularizer: Regularizer
) -> torch.Tensor:
    """φ(F(x), F̂^y) over a batch; samples whose label has no teacher add 0 (and count in B)."""
    if regularizer == "mse":
        return class_target_loss(logits, labels, teacher, present, "mse")
    if regularizer == "kl":
        target = F.softmax(teacher[labels], dim=1)
        kl = (target * (F.log_softmax(teacher[labels], dim=1) - F.log_softmax(logits, dim=1))).sum(1)
        return (kl * present[labels].to(logits.dtype)).sum() / logits.shape[0]
    raise ValueError(f"unknown regularizer {regularizer!r}")


def distill_loss(
    teacher: tuple[torch.Tensor, torch.Tensor] | None,
    coef: float,
    regularizer: Regularizer,
    record: ClassStats | None = None,
) -> ExtraLoss | None:
    """The extra loss λ·φ for ``ctx.train``; it also records the batch logits into ``record``.

    None when there is nothing to add or record (λ = 0 or no teacher, and no recording), so
    training is then exactly the plain CE pass.
    """
    active = teacher is not None and coef > 0
    if not active and record is None:
        return None

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if record is not None:
            record.add(logits, y)
        if not active:
            return logits.new_zeros(())  # adds exactly nothing to the loss or its gradient
        return coef * distill_divergence(logits, y, *teacher, regularizer)

    return term


class FedDistillServer(LocalServer):
    """Keeps the previous round's uploads; builds each client's teacher from them."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.uploads: dict[int, Tensors] = {}

    def teacher(self, cid: int) -> Tensors:
        opts: FedDistillConfig = self.ctx.options
        mean = ClassMean(opts.aggregation)
        others = [j for j in sorted(self.uploads) if not (opts.exclude_self and j == cid)]
        if not others:
            return {}
        for j in others:
            mean.add(self.uploads[j][MEANS], self.uploads[j][COUNTS])
        means, present = mean.result()
        return {TEACHER: means, PRESENT: present}

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FedDistillConfig = self.ctx.options
        if opts.exclude_self:
            messages = {cid: Message("fit", self.teacher(cid)) for cid in clients}
        else:  # one teacher for everybody
            shared = Message("fit", self.teacher(-1))
            messages = {cid: shared for cid in clients}
        uploads = {}
        for cid, reply in comm.stream(messages):
            uploads[cid] = {MEANS: reply.tensors[MEANS], COUNTS: reply.tensors[COUNTS]}
        self.uploads = uploads


class FedDistillClient(LocalClient):
    """Keeps its whole model in ``ctx.state["weights"]`` (as ``local``); uploads mean logits only."""

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedDistillConfig = ctx.options
        model = self._personal(ctx)
        teacher = None
        if TEACHER in msg.tensors and bool(msg.tensors[PRESENT].any()):
            teacher = (msg.tensors[TEACHER], msg.tensors[PRESENT])
        record = ClassStats.zeros(ctx.num_classes, ctx.num_classes, ctx.device) if opts.logits == "training" else None
        ctx.train(hook=Term(distill_loss(teacher, opts.lam, opts.regularizer, record)))
        ctx.state["weights"] = ctx.weights()
        if record is None:
            record = class_statistics(model, ctx.dataset, ctx.data.train, ctx.num_classes, output="logits")
        return ctx.reply({MEANS: record.means, COUNTS: record.counts})


FEDDISTILL = Algorithm(
    name="feddistill",
    summary="FedDistill (Jeong et al. 2018): local models exchange per-label mean logits; distillation to them",
    server=FedDistillServer,
    client=FedDistillClient,
    config=FedDistillConfig,
    reference=Reference(PFLLIB, options={"regularizer": "mse", "exclude_self": False, "aggregation": "uniform"}),
    why_not={"segmentation": "its per-class logit averages are of per-sample outputs"},
    robust="averages per-class logits, not models",
    dp="uploads per-class logits, not updates of a model sent",
)
