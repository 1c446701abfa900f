"""Ditto: Fair and Robust Federated Learning Through Personalization.

Li, Hu, Beirami and Smith, ICML 2021 (Algorithm 1). Beside the global objective G(w), solved with
FedAvg, each client k learns a personal model v_k for

    min_{v_k} h_k(v_k; w*) = F_k(v_k) + (λ/2) · ‖v_k − w*‖².

In round t a sampled client (a) trains the received w^t for E epochs and uploads the result (the
FedAvg update; the server is FedAvg's), and (b) trains its own v_k with the proximal term towards
the same w^t it received, then keeps v_k. Only the global model ever leaves the client.

Where v_k starts (``personal_init``; the paper does not say): ``received`` (the option default)
starts it from the global model the client receives the first time it is sampled, and evaluates a
client never sampled with the current global model; ``initial`` starts every v_k from the run's
initial model w^0 and evaluates a client never sampled with w^0, as the authors' code
(litian96/ditto, ``local_models`` copies of the initial model) and PFLlib (``model_per`` a copy of
the initial model) do: Ditto's reference setting.

Interpretations beside that: the authors' code alternates one personal and one global step on
each mini-batch and samples clients with probability ∝ n_k, averaging uniformly; fedtail trains
the global model's epochs, then the personal ones (as PFLlib), and samples uniformly with an
n_k-weighted average (as FedAvg and PFLlib). Both give the personal model as many steps as the
global one (``personal_epochs`` null), as the authors' code does (PFLlib defaults to 1 epoch).

Default λ = 1 (*interpretation*): the paper picks λ per device on validation data from {0.1, 1, 2}
outside strong attacks, and uses the fixed λ = 1 there when a device has too few validation samples.
A benchmark chooses λ on its own validation data and names it in its sweep file (MuPFL's Table II
uses 10; docs/defaults.md lists every such setting).

Missing replies (``--dropout``, rejected replies): the global model is FedAvg's mean of the
replies that arrived; a client that did not reply keeps its personal model v_k unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Message, PersonalClient, Reference, Tensors
from fedtail.algorithms.base import Term
from fedtail.algorithms.fedavg import FedAvgServer
from fedtail.algorithms.fedprox import proximal_term

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext


class DittoConfig(AlgorithmConfig):
    lam: float = Field(1.0, ge=0, description="λ in (λ/2)·‖v − w_global‖²: pull of the personal model to the global")
    personal_epochs: int | None = Field(
        None, ge=1, description="epochs on the personal model per round (null: the run's --local-epochs)"
    )
    personal_init: Literal["received", "initial"] = Field(
        "received",
        description="where a personal model starts: the first global model the client receives (received), "
        "or the run's initial model w^0 (initial: the authors' code and PFLlib; also what an unsampled client "
        "is evaluated with)",
    )


class DittoClient(PersonalClient):
    def start(self, msg: Message, ctx: ClientContext) -> Tensors:
        """See ``personal_init``."""
        return ctx.init_weights if ctx.options.personal_init == "initial" else msg.tensors

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: DittoConfig = ctx.options
        # (a) the global update, exactly as in FedAvg.
        ctx.load(msg.tensors)
        ctx.train()
        upload = ctx.weights()
        # (b) the personal model, pulled towards the w^t received this round (not the update above).
        personal = ctx.load(ctx.state.get("personal", self.start(msg, ctx)), role="personal")
        ctx.train(
            "personal",
            epochs=opts.personal_epochs,
            hook=Term(proximal_term(personal, msg.tensors, opts.lam)),
        )
        ctx.state["personal"] = ctx.weights("personal")
        return ctx.reply(upload)


DITTO = Algorithm(
    name="ditto",
    summary="Ditto (Li et al. 2021): FedAvg global model plus a personal model regularised towards it",
    server=FedAvgServer,
    client=DittoClient,
    config=DittoConfig,
    reference=Reference("the authors' code (litian96/ditto); PFLlib alike", options={"personal_init": "initial"}),
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
