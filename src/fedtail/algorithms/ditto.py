"""Ditto: Fair and Robust Federated Learning Through Personalization.

Li, Hu, Beirami and Smith, ICML 2021 (Algorithm 1). Beside the global objective G(w), solved with
FedAvg, each client k learns a personal model v_k for

    min_{v_k} h_k(v_k; w*) = F_k(v_k) + (λ/2) · ‖v_k − w*‖².

In round t a sampled client (a) trains the received w^t for E epochs and uploads the result (the
FedAvg update; the server is FedAvg's), and (b) trains its own v_k with the proximal term towards
the same w^t it received, then keeps v_k. Only the global model ever leaves the client.
A client's personal model starts from the global model it receives the first time it is sampled;
clients never sampled are evaluated with the current global model.

Default λ = 1 (*interpretation*): the paper picks λ per device on validation data from {0.1, 1, 2}
outside strong attacks, and uses the fixed λ = 1 there when a device has too few validation samples.
A benchmark chooses λ on its own validation data and names it in its sweep file (MuPFL's Table II
uses 10; docs/defaults.md lists every such setting).

Missing replies (``--dropout``, rejected replies): the global model is FedAvg's mean of the
replies that arrived; a client that did not reply keeps its personal model v_k unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Message, PersonalClient
from fedtail.algorithms.fedavg import FedAvgServer
from fedtail.algorithms.fedprox import proximal_term

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext


class DittoConfig(AlgorithmConfig):
    lam: float = Field(1.0, ge=0, description="λ in (λ/2)·‖v − w_global‖²: pull of the personal model to the global")
    personal_epochs: int | None = Field(
        None, ge=1, description="epochs on the personal model per round (null: the run's --local-epochs)"
    )


class DittoClient(PersonalClient):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: DittoConfig = ctx.options
        # (a) the global update, exactly as in FedAvg.
        ctx.load(msg.tensors)
        ctx.train()
        upload = ctx.weights()
        # (b) the personal model, pulled towards the w^t received this round (not the update above).
        personal = ctx.load(ctx.state.get("personal", msg.tensors), role="personal")
        ctx.train(
            "personal",
            epochs=opts.personal_epochs,
            extra_loss=proximal_term(personal, msg.tensors, opts.lam),
        )
        ctx.state["personal"] = ctx.weights("personal")
        return ctx.reply(upload)


DITTO = Algorithm(
    name="ditto",
    summary="Ditto (Li et al. 2021): FedAvg global model plus a personal model regularised towards it",
    server=FedAvgServer,
    client=DittoClient,
    config=DittoConfig,
)
