"""A FedProx-like algorithm written outside fedtail, against the public contract (fedtail.api).

Run it against the baselines (from the repository root, with this folder on PYTHONPATH):

    PYTHONPATH=examples fedtail run --algorithm my_fedprox:ALGORITHM --dataset synthetic --model mlp \
        --rounds 5 --set algo.mu=0.1 --out runs/mine

Client k minimises F_k(w) + (mu/2)·||w − w_global||² for the run's local epochs; the server takes
the sample-weighted mean of the replies (FedAvg's aggregation).
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedtail.api import Algorithm, AlgorithmConfig, ClientHalf, Message, ServerHalf, Term, WeightedMean


class Options(AlgorithmConfig):
    mu: float = Field(0.01, ge=0, description="weight of the proximal term")


class Server(ServerHalf):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.weights = dict(ctx.init_weights)  # the global model; everything in vars(self) is checkpointed

    def run_round(self, rnd, clients, comm) -> None:
        mean = WeightedMean()
        for _, reply in comm.stream({cid: Message("fit", self.weights) for cid in clients}):
            mean.add(reply.tensors, reply.num_examples)
        self.weights = mean.result()

    def global_weights(self):
        return self.weights


class Client(ClientHalf):
    def fit(self, msg: Message, ctx) -> Message:
        model = ctx.load(msg.tensors)
        anchor = [msg.tensors[name] for name, _ in model.named_parameters()]
        mu = ctx.options.mu

        def proximal(model, x, y, logits) -> torch.Tensor:
            return 0.5 * mu * sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))

        ctx.train(hook=Term(proximal))
        return ctx.reply(ctx.weights())


ALGORITHM = Algorithm(
    name="my-fedprox",
    summary="an example: FedProx written as a plug-in",
    server=Server,
    client=Client,
    config=Options,
)
