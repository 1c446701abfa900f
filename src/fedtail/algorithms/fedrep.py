"""FedRep: Exploiting Shared Representations for Personalized Federated Learning.

Collins, Hassani, Mokhtari and Shakkottai, ICML 2021 (Algorithm 1). The model is a shared body
(representation) φ and a local head h_i per client. In round t a sampled client, given φ^t,

    1. trains its head with the body frozen:  h_i ← GRD(f_i(h_i, φ^t), h_i)    for τ_h epochs,
    2. trains the body with the new head frozen: φ_i ← GRD(f_i(h_i, φ_i), φ_i)  for τ_φ epochs,

keeps h_i and uploads only φ_i; the server averages the sampled clients' bodies, weighted by
their sample counts as in FedAvg: φ^{t+1} = Σ_{i∈S_t} (n_i / n_S) · φ_i.
A client's head starts as the run's common initial head; a client is always evaluated with the
current global body and its own head. There is no global model (no global head).

Defaults (*interpretation*): the authors' code trains the head for 10 epochs and the body for 1
epoch per round; here ``head_epochs`` defaults to the run's --local-epochs and ``body_epochs`` to 1.

``final_finetune``: the authors' code (``main_fed.py``, ``LocalUpdate.train(last=True)``) ends
with one more round in which every client, sampled or not, trains its head alone on the final
global body for max(10, τ_h) epochs (their ``max(10, local_ep − local_rep_ep)``) and is then
evaluated; the body is not updated. Here that is an exchange with every client after the last
round's aggregation (``finetune``); a client whose reply is missing keeps its head. The paper's
Algorithm 1 has no such round, so the option's default is off. The fine-tuning counts epochs
even in a run with ``--local-steps`` (as the authors' code does), trains on the client's current
data (with stage tasks: the last stage's only, so a head may forget the earlier stages' classes,
as FedRep would in that setting), and does not happen if the last round itself is skipped (no
reply at all). Its training and replies count in the last round's log (samples, loss, replied).

Missing replies (``--dropout``, rejected replies): φ^{t+1} is the sample-weighted mean of the
bodies that arrived; a client that did not reply keeps its head h_i unchanged.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them): the
authors' code (lgcollins/FedRep, ``models/Update.py``): the head is the last linear layer
(FedRep's paper: the final layer; PFLlib: ``model.fc``); SGD with momentum 0.5 and weight decay
10⁻⁴ (the authors exempt biases from the decay; here it applies to every parameter), no
clipping; the final head fine-tuning round (``final_finetune = true``). ``--head all-fc``
moves every FC layer into the head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ClientHalf,
    Comm,
    Message,
    Reference,
    ServerHalf,
    Tensors,
)

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import TrainStats
    from fedtail.models import SplitModel


class FedRepConfig(AlgorithmConfig):
    head_epochs: int | None = Field(
        None, ge=1, description="epochs on the head (body frozen) per round (null: the run's --local-epochs)"
    )
    body_epochs: int = Field(1, ge=1, description="epochs on the body (head frozen) per round, after the head")
    final_finetune: bool = Field(
        False,
        description="after the last round every client trains its head alone on the final body for "
        "max(10, head epochs) epochs (the authors' code)",
    )


class BodyServer(ServerHalf):
    """A global body, the sample-weighted mean of the uploaded bodies (FedRep, FedPer, FedBABU, FedPAC)."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        body_keys = ctx.model().body_keys()
        self.body: Tensors = {k: ctx.init_weights[k] for k in body_keys}

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        mean = WeightedMean()
        for _, reply in comm.stream({cid: Message("fit", self.body) for cid in clients}):
            mean.add(reply.tensors, reply.num_examples)
        self.body = mean.result()

    def evaluation_message(self, cid: int) -> Message:
        return Message("evaluate", self.body)


class FedRepServer(BodyServer):
    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        super().run_round(rnd, clients, comm)
        if self.ctx.options.final_finetune and rnd == self.ctx.config.rounds:
            comm.exchange({cid: Message("finetune", self.body) for cid in range(self.ctx.num_clients)})


def train_only(
    ctx: ClientContext, part: nn.Module, frozen: nn.Module, epochs: int | None, **train_args: Any
) -> TrainStats:
    """SGD on the parameters of ``part`` while ``frozen`` gets no gradient at all.

    Switching off ``requires_grad`` (not just leaving ``frozen`` out of the optimizer) skips the
    frozen part's backward pass, which is most of the cost of the head epochs. BatchNorm running
    statistics in a frozen body still follow the batches, since the model trains in train mode.
    """
    frozen.requires_grad_(False)
    try:
        return ctx.train(epochs=epochs, params=list(part.parameters()), **train_args)
    finally:
        frozen.requires_grad_(True)


class FedRepClient(ClientHalf):
    def _load(self, body: Tensors, ctx: ClientContext) -> SplitModel:
        """The main model with the global ``body`` and this client's head (first time: the initial head)."""
        head = ctx.state.get("head")
        if head is None:
            head = {k: ctx.init_weights[k] for k in ctx.model().head_keys()}
        return ctx.load(body | head)

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedRepConfig = ctx.options
        model = self._load(msg.tensors, ctx)
        train_only(ctx, model.head, model.body, opts.head_epochs)  # None: the run's local epochs
        train_only(ctx, model.body, model.head, opts.body_epochs)
        ctx.state["head"] = ctx.weights(keys=model.head_keys())
        return ctx.reply(ctx.weights(keys=model.body_keys()))

    def finetune(self, msg: Message, ctx: ClientContext) -> Message:
        """The authors' last round: the head alone, max(10, τ_h) epochs, on the final body."""
        opts: FedRepConfig = ctx.options
        model = self._load(msg.tensors, ctx)
        epochs = max(10, opts.head_epochs or ctx.train_config.local_epochs)
        train_only(ctx, model.head, model.body, epochs)
        ctx.state["head"] = ctx.weights(keys=model.head_keys())
        return ctx.reply({})

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        self._load(msg.tensors, ctx)
        return ctx.evaluate()


FEDREP = Algorithm(
    name="fedrep",
    summary="FedRep (Collins et al. 2021): shared body averaged, local heads; head epochs then body epochs",
    server=FedRepServer,
    client=FedRepClient,
    config=FedRepConfig,
    reference=Reference(
        "the authors' code", head="last", momentum=0.5, weight_decay=1e-4, options={"final_finetune": True}
    ),
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
