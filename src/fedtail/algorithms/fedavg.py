"""FedAvg: Communication-Efficient Learning of Deep Networks from Decentralized Data.

McMahan et al., AISTATS 2017 (Algorithm 1). Each round the server sends the global model
w^t to the sampled clients S_t; client k runs E epochs of SGD on its n_k samples, giving
w_k^{t+1}; the server sets

    w^{t+1} = Σ_{k∈S_t} (n_k / n_S) · w_k^{t+1},   n_S = Σ_{k∈S_t} n_k.

Personalised accuracy is the global model evaluated on each client's local test data.

Missing replies (``--dropout``, rejected replies): the mean runs over the replies that arrived
(n_S sums their sample counts), as if the clients that did not reply had not been sampled.

Reference settings (what a run gets unless it sets them; ``fedtail list``): PFLlib's, the
library FedReMa's code is built on and whose implementations stand for FedReMa's baselines:
plain SGD (momentum 0), no gradient clipping, the model's own body/head split
(unused: the whole model is averaged).
"""

from __future__ import annotations

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import PFLLIB, Algorithm, ClientHalf, Comm, Message, Reference, ServerHalf, Tensors
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext


class FedAvgServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.weights: Tensors = dict(ctx.init_weights)

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        mean = WeightedMean()
        for _, reply in comm.stream({cid: Message("fit", self.weights) for cid in clients}):
            mean.add(reply.tensors, reply.num_examples)
        self.weights = mean.result()

    def global_weights(self) -> Tensors:
        return self.weights


class FedAvgClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        ctx.load(msg.tensors)
        ctx.train()
        return ctx.reply(ctx.weights())


FEDAVG = Algorithm(
    name="fedavg",
    summary="FedAvg (McMahan et al. 2017): sample-weighted average of locally trained models",
    server=FedAvgServer,
    client=FedAvgClient,
    reference=Reference(PFLLIB),
    personal_model=False,
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
