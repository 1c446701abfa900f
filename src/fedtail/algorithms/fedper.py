"""FedPer: Federated Learning with Personalization Layers.

Arivazhagan, Aggarwal, Singh and Choudhary, arXiv:1912.00818, 2019 (Algorithm 1). The model is
a shared base (body) W_B and personalisation layers (head) W_P,i kept by each client. In round
t a sampled client loads the global base with its own head, trains both jointly for E epochs
of SGD, keeps W_P,i and uploads only the base; the server averages the bases like FedAvg:

    W_B^{t+1} = Σ_{i∈S_t} (n_i / n_S) · W_B,i^{t+1}.

The only difference from FedRep (:mod:`fedtail.algorithms.fedrep`) is that body and head are
trained together rather than head first, body second. A client's head starts as the run's
common initial head; clients are evaluated with the current global base and their own head.
The split is the model's body/head split (FedAC's convnet: the last linear layer is the head).

Missing replies (``--dropout``, rejected replies): as FedRep, the base averages the bodies that
arrived, and a client that did not reply keeps its head.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them):
the personalisation layer is the last linear layer, as in PFLlib (``model.fc``), whose
implementation stands for FedReMa's baseline; plain SGD (momentum 0), no clipping. On
``cnn2fc`` a client keeps 5,130 of 582,026 parameters and FC 512 is shared; ``--head all-fc``
(the model's own split, what runs made before the reference split used) keeps both FC layers,
91 % of the parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtail.algorithms.base import PFLLIB, Algorithm, Message, Reference
from fedtail.algorithms.fedrep import FedRepClient, BodyServer

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext


class FedPerClient(FedRepClient):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        model = self._load(msg.tensors, ctx)
        ctx.train()
        ctx.state["head"] = ctx.weights(keys=model.head_keys())
        return ctx.reply(ctx.weights(keys=model.body_keys()))


FEDPER = Algorithm(
    name="fedper",
    summary="FedPer (Arivazhagan et al. 2019): shared body averaged, local heads, trained jointly",
    server=BodyServer,
    client=FedPerClient,
    reference=Reference(PFLLIB, head="last"),
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
