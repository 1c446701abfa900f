"""Local: every client trains its own model alone, with no communication.

The lower reference of personalised FL. Each client starts from the run's common initial
model, keeps its weights in its own state, and trains E epochs per round when sampled; the
same sampling stream as the federated methods keeps training budgets comparable.

Missing replies (``--dropout``, rejected replies): a client that does not reply keeps its model
as it was, untrained that round; nothing is aggregated, so nothing else changes.

Reference settings (what a run gets unless it sets them; ``fedtail list``): PFLlib's, the
library FedReMa's code is built on and whose implementations stand for FedReMa's baselines:
plain SGD (momentum 0), no gradient clipping, the model's own body/head split
(unused: the whole model is trained).
"""

from __future__ import annotations

from fedtail.algorithms.base import PFLLIB, Algorithm, ClientHalf, Comm, Message, Reference, ServerHalf
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext


class LocalServer(ServerHalf):
    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        # The initial model goes out once per client; afterwards clients only get a "train" cue.
        comm.exchange({cid: Message("fit") for cid in clients})

    def evaluation_message(self, cid: int) -> Message:
        return Message("evaluate")


class LocalClient(ClientHalf):
    def _personal(self, ctx: ClientContext):
        weights = ctx.state.get("weights")
        return ctx.load(weights if weights is not None else ctx.init_weights)

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        self._personal(ctx)
        ctx.train()
        ctx.state["weights"] = ctx.weights()
        return ctx.reply()

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        self._personal(ctx)
        return ctx.evaluate()


LOCAL = Algorithm(
    name="local",
    summary="Local training only: each client's own model, no communication (lower reference)",
    server=LocalServer,
    client=LocalClient,
    reference=Reference(PFLLIB),
    tasks=("classification", "segmentation"),
    robust="aggregates nothing",
    dp="uploads nothing",
)
