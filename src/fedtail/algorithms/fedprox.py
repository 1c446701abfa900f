"""FedProx: Federated Optimization in Heterogeneous Networks.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, MLSys 2020 (Algorithm 2). FedAvg in which
client k, given the global model w^t, (inexactly) minimises the proximal local objective

    h_k(w; w^t) = F_k(w) + (μ/2) · ‖w − w^t‖²,

here with the run's E epochs of SGD. The server aggregates exactly like FedAvg,

    w^{t+1} = Σ_{k∈S_t} (n_k / n_S) · w_k^{t+1}.

The proximal term limits client drift on heterogeneous data; μ = 0 is FedAvg. The paper tunes μ
over {0.001, 0.01, 0.1, 1}; the default 0.01 is a mild pull from that grid.

Missing replies (``--dropout``, rejected replies): as FedAvg, the mean runs over the replies that
arrived.

Reference settings (what a run gets unless it sets them; ``fedtail list``): PFLlib's, the
library FedReMa's code is built on and whose implementations stand for FedReMa's baselines:
plain SGD (momentum 0), no gradient clipping, the model's own body/head split
(unused: the whole model is averaged and pulled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import Field

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, ClientHalf, Message, Reference
from fedtail.algorithms.base import Term
from fedtail.algorithms.fedavg import FedAvgServer

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext
    from fedtail.engine.training import ExtraLoss


class FedProxConfig(AlgorithmConfig):
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ in (μ/2)·‖w − w_global‖²")


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], coef: float) -> ExtraLoss:
    """An extra loss ``(coef/2) · Σ_p ‖p − anchor_p‖²`` over the parameters of ``model``.

    The anchor tensors are looked up once here, in ``model.parameters()`` order, so each step
    only zips two lists. Buffers (BatchNorm statistics) are not parameters and are not pulled.
    """
    targets = [anchor[name] for name, _ in model.named_parameters()]

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return 0.5 * coef * sum((p - t).pow(2).sum() for p, t in zip(model.parameters(), targets, strict=True))

    return term


class FedProxClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedProxConfig = ctx.options
        model = ctx.load(msg.tensors)
        # msg.tensors is w^t itself: load() copied it into the model, so it stays fixed as the anchor.
        ctx.train(hook=Term(proximal_term(model, msg.tensors, opts.mu)))
        return ctx.reply(ctx.weights())


FEDPROX = Algorithm(
    name="fedprox",
    summary="FedProx (Li et al. 2020): FedAvg with a proximal term (μ/2)·‖w − w_global‖² in local training",
    server=FedAvgServer,
    client=FedProxClient,
    config=FedProxConfig,
    reference=Reference(PFLLIB),
    personal_model=False,
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
